%% Common Test: fusex:xla_register/0,1 registers every XLA custom-call
%% target for Host and CUDA with the XLA that EXLA loaded in the VM. A
%% stand-in EXLA NIF (test/xla/fake_exla_nif.c) loads a stand-in
%% libxla_extension.so (test/xla/fake_xla_api.c: it asks each handler for
%% its FFI API version, as XLA does, and records what registers) RTLD_LOCAL,
%% as EXLA's NIF loads XLA. The fixtures are built by `make test-erl'
%% (FUSEX_TEST_XLA_DIR names them); without them the suite fails.
-module(fusex_xla_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([before_xla_is_loaded/1, library_not_loaded/1, after_exla_is_loaded/1, again_is_a_no_op/1,
         by_path/1, concurrently/1, bad_library/1]).

%% In this order: the first two run before the stand-in XLA is loaded.
all() ->
    [before_xla_is_loaded, library_not_loaded, bad_library, after_exla_is_loaded, again_is_a_no_op,
     by_path, concurrently].

%% Every op's forward, backward and step (the norms have no step); the
%% linear layers are no XLA targets.
-define(TARGETS,
        [<<"fusex_", Op/binary, "_", Dir/binary>>
         || Op <- [<<"selective_scan">>, <<"linear_scan">>, <<"mingru">>, <<"minlstm">>, <<"liquid">>,
                   <<"causal_conv1d">>, <<"gru">>, <<"lstm">>],
            Dir <- [<<"fwd">>, <<"bwd">>, <<"step">>]]
        ++ [<<"fusex_", Op/binary, "_", Dir/binary>>
            || Op <- [<<"rms_norm">>, <<"layer_norm">>], Dir <- [<<"fwd">>, <<"bwd">>]]).

init_per_suite(Config) ->
    Dir = os:getenv("FUSEX_TEST_XLA_DIR", ""),
    Files = [filename:join(Dir, "fake_exla_nif.so"),
             filename:join([Dir, "xla_extension", "lib", "libxla_extension.so"]),
             filename:join(fusex_nif:priv_dir(), "fusex_xla.so")],
    case [F || F <- Files, not filelib:is_regular(F)] of
        [] -> [{xla_dir, Dir} | Config];
        Missing ->
            {fail, lists:flatten(io_lib:format("not built: ~p (make test-erl builds the stand-ins and sets "
                                               "FUSEX_TEST_XLA_DIR; fusex_xla.so needs the XLA FFI headers, "
                                               "see docs/XLA.md)", [Missing]))}
    end.

end_per_suite(_Config) -> ok.

before_xla_is_loaded(_Config) ->
    {error, Why} = fusex:xla_register(),
    ct:log("~ts", [Why]),
    ?assertMatch({_, _}, binary:match(Why, <<"libxla_extension.so is not loaded in this process">>)).

library_not_loaded(_Config) ->
    {error, Why} = fusex:xla_register("/nonexistent/libxla_extension.so"),
    ?assertMatch({_, _}, binary:match(Why, <<"/nonexistent/libxla_extension.so is not loaded">>)).

bad_library(_Config) ->
    ?assertError({badarg, <<"library: expected the path or soname of a loaded XLA library, got 42">>},
                 fusex:xla_register(42)),
    ?assertError({badarg, <<"library: expected the path or soname of a loaded XLA library, got <<>>">>},
                 fusex:xla_register(<<>>)).

after_exla_is_loaded(Config) ->
    ok = fusex_fake_exla:load(?config(xla_dir, Config)),
    ?assertEqual([], registrations()),
    ok = fusex:xla_register(),
    expect_all_registered().

again_is_a_no_op(_Config) ->
    ok = fusex:xla_register(),
    expect_all_registered().

by_path(Config) ->
    Lib = filename:join([?config(xla_dir, Config), "xla_extension", "lib", "libxla_extension.so"]),
    ok = fusex:xla_register(Lib),
    ok = fusex:xla_register(list_to_binary(Lib)),
    expect_all_registered().

concurrently(_Config) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {self(), fusex:xla_register()} end) || _ <- lists:seq(1, 16)],
    [receive {Pid, Result} -> ?assertEqual(ok, Result) after 10000 -> ct:fail(timeout) end || Pid <- Pids],
    expect_all_registered().

%% Every target once for each platform, each reporting FFI API 0.2.
expect_all_registered() ->
    Want = lists:sort([{T, P, <<"0.2">>} || T <- ?TARGETS, P <- [<<"Host">>, <<"CUDA">>]]),
    Got = lists:sort(registrations()),
    ct:log("~p registrations: ~p", [length(Got), Got]),
    ?assertEqual(56, length(Want)),
    ?assertEqual(Want, Got).

registrations() ->
    [list_to_tuple(binary:split(R, <<"@">>, [global]))
     || R <- binary:split(fusex_fake_exla:registrations(), <<";">>, [global, trim_all])].
