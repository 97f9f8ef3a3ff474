#!/usr/bin/env bash
# Packs the OTP applications Common Test needs beyond ../shared/gpu/pack-beam's
# set (debugger, ftp, observer, snmp, ssh, ...) into .gpu/beam-extra.txz, for
# the GPU machine, which has no package manager access, with the jQuery files
# common_test's HTML logs link to. Unpack it after
# beam.txz: tar --keep-directory-symlink -C / -xJf .gpu/beam-extra.txz
set -euo pipefail
root=$(git rev-parse --show-toplevel)
pkgs="erlang-debugger erlang-ftp erlang-observer erlang-snmp erlang-ssh erlang-dialyzer
      erlang-reltool erlang-os-mon erlang-tftp erlang-mnesia erlang-et
      libjs-jquery libjs-jquery-tablesorter"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
( cd "$work" && apt-get download $pkgs >/dev/null )
mkdir "$work/tree"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/tree"; done
# Keep /usr/share/javascript: common_test's log assets are symlinks into it.
find "$work/tree/usr/share" -mindepth 1 -maxdepth 1 ! -name javascript -exec rm -rf {} +
XZ_OPT=-6 tar -C "$work/tree" -cJf "$root/.gpu/beam-extra.txz" usr
echo "packed $(du -h "$root/.gpu/beam-extra.txz" | cut -f1) into .gpu/beam-extra.txz"
