#!/usr/bin/env escript
%% Runs the fusex benchmarks: bench/fusex_bench.escript [--ops a,b] [--device cuda] [--out F]
%%! -noshell
main(Args) ->
    Root = filename:dirname(filename:dirname(filename:absname(escript:script_name()))),
    true = code:add_patha(filename:join([Root, "_build", "default", "lib", "fusex", "ebin"])),
    fusex_bench:main(Args).
