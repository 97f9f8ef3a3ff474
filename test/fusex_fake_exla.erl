%% @private
%% A stand-in for EXLA in fusex_xla_SUITE: its NIF
%% (test/xla/fake_exla_nif.c) loads a stand-in libxla_extension.so as
%% EXLA's NIF loads XLA, and reads back what was registered with it.
-module(fusex_fake_exla).

-export([load/1, registrations/0]).

-spec load(file:filename()) -> ok | {error, term()}.
load(Dir) -> erlang:load_nif(filename:join(Dir, "fake_exla_nif"), 0).

%% `<<"fusex_mingru_fwd@Host@0.2;...">>': name, platform and the FFI API
%% version the handler reported.
-spec registrations() -> binary().
registrations() -> erlang:nif_error(not_loaded).
