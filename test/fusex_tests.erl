%% EUnit: the tensor API on the device under test (FUSEX_DEVICE), round
%% trips for every type, and every kind of bad input.
-module(fusex_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, encode/2, tensor/3, values/1]).

-define(TYPES, [{f, 32}, {f, 64}, {bf, 16}, {f, 16}, {s, 32}, {s, 64}, {u, 8}]).

-define(assertBadarg(Msg, Expr),
        ?assertError({badarg, Msg}, Expr)).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

devices_test() ->
    Devices = fusex:devices(),
    [Cpu, Reference | Gpus] = Devices,
    ?assertMatch(#{id := cpu, kind := cpu, path := fast, name := _, memory_total := _, memory_free := _}, Cpu),
    ?assertMatch(#{id := {cpu, reference}, kind := cpu, path := reference}, Reference),
    case Gpus of
        [] -> ?assert(is_binary(maps:get(cuda_unavailable, Cpu)));
        _ -> [?assertMatch(#{kind := cuda, id := {cuda, _}, compute_capability := {_, _}}, G)
              || G <- Gpus]
    end.

random_values({u, 8}, N) -> [rand:uniform(256) - 1 || _ <- lists:seq(1, N)];
random_values({s, 32}, N) -> [rand:uniform(1 bsl 32) - (1 bsl 31) - 1 || _ <- lists:seq(1, N)];
random_values({s, 64}, N) -> [rand:uniform(1 bsl 64) - (1 bsl 63) - 1 || _ <- lists:seq(1, N)];
random_values(_, N) -> fusex_test_util:normal(N).

round_trip_every_type_test_() ->
    Shapes = [{}, {1}, {7}, {3, 5}, {2, 3, 4}, {0, 5}, {4097}, {2, 1, 3, 1, 2}],
    [{lists:flatten(io_lib:format("~p ~p", [Type, Shape])),
      fun() ->
              N = lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)),
              Bin = encode(Type, random_values(Type, N)),
              T = fusex:tensor(Bin, Type, Shape, #{device => device()}),
              ?assertEqual(Shape, fusex:shape(T)),
              ?assertEqual(Type, fusex:type(T)),
              ?assertEqual(device(), fusex:device(T)),
              ?assertEqual(N, fusex:size(T)),
              ?assertEqual(byte_size(Bin), fusex:byte_size(T)),
              ?assertEqual(Bin, fusex:to_binary(T)),
              ?assertEqual(Bin, fusex:to_binary(fusex:copy(T, cpu))),
              ?assertEqual(Bin, fusex:to_binary(fusex:copy(fusex:copy(T, cpu), device())))
      end} || Type <- ?TYPES, Shape <- Shapes].

large_round_trip_test() ->
    Bin = rand:bytes(16 bsl 20 + 5),
    T = fusex:tensor(Bin, {u, 8}, {byte_size(Bin)}),
    ?assertEqual(Bin, fusex:to_binary(T)).

zeros_test() ->
    [begin
         T = fusex:zeros(Type, {3, 4}),
         ?assertEqual(binary:copy(<<0>>, 12 * Bits div 8), fusex:to_binary(T))
     end || {_, Bits} = Type <- ?TYPES],
    ?assertEqual(cpu, fusex:device(fusex:zeros({f, 32}, {2}, #{device => cpu}))).

convert_test() ->
    Values = [1.0, -2.5, 3.25, 0.125, 1000.0],
    T = tensor({f, 32}, {5}, Values),
    ?assertEqual(Values, values(fusex:convert(fusex:convert(T, {f, 64}), {f, 32}))),
    fusex_test_util:assert_close(values(fusex:convert(T, {bf, 16})), Values, 4.0e-3),
    fusex_test_util:assert_close(values(fusex:convert(T, {f, 16})), Values, 5.0e-4),
    ?assertEqual([1, -2, 3, 0, 1000], values(fusex:convert(T, {s, 32}))),
    %% saturating integer conversion
    Big = tensor({f, 32}, {3}, [1.0e12, -1.0e12, 300.0]),
    ?assertEqual([255, 0, 255], values(fusex:convert(Big, {u, 8}))),
    ?assertEqual([2147483647, -2147483648, 300], values(fusex:convert(Big, {s, 32}))).

arithmetic_test() ->
    A = tensor({f, 32}, {2, 2}, [1.0, 2.0, 3.0, 4.0]),
    B = tensor({f, 32}, {2, 2}, [0.5, -1.0, 2.0, 8.0]),
    ?assertEqual([1.5, 1.0, 5.0, 12.0], values(fusex:add(A, B))),
    ?assertEqual([0.5, 3.0, 1.0, -4.0], values(fusex:subtract(A, B))),
    ?assertEqual([0.5, -2.0, 6.0, 32.0], values(fusex:multiply(A, B))),
    ?assertEqual([-2.0, -4.0, -6.0, -8.0], values(fusex:scale(A, -2))),
    I = tensor({s, 64}, {3}, [1 bsl 60, -5, 7]),
    ?assertEqual([1 bsl 61, -10, 14], values(fusex:add(I, I))).

reshape_shares_memory_test() ->
    A = tensor({f, 32}, {2, 3}, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    V = fusex:reshape(A, {3, 2}),
    ?assertEqual({3, 2}, fusex:shape(V)),
    ?assertEqual(fusex:to_binary(A), fusex:to_binary(V)),
    Before = fusex:memory(device()),
    ok = fusex:free(A),
    %% the view keeps the buffer alive
    ?assertEqual(maps:get(allocated, Before), maps:get(allocated, fusex:memory(device()))),
    ?assertEqual([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], values(V)),
    ?assertBadarg(<<"shape: expected 6 elements (as in {3,2}), got {4} with 4">>,
                  fusex:reshape(V, {4})).

free_is_idempotent_test() ->
    T = tensor({f, 32}, {2}, [1.0, 2.0]),
    ?assertEqual(ok, fusex:free(T)),
    ?assertEqual(ok, fusex:free(T)),
    Msg = <<"tensor: expected a live tensor, got one released by fusex:free/1">>,
    ?assertBadarg(Msg, fusex:to_binary(T)),
    ?assertBadarg(Msg, fusex:shape(T)),
    ?assertBadarg(<<"a: expected a live tensor, got one released by fusex:free/1">>,
                  fusex:add(T, T)),
    ?assertEqual(ok, fusex:synchronize(T)).

memory_accounting_test() ->
    Device = device(),
    %% tensors earlier tests left behind are destroyed asynchronously after
    %% their processes exit: wait until the counters settle
    #{allocated := A0, live_tensors := L0} = fusex_test_util:settled_memory(Device),
    T = fusex:zeros({f, 64}, {1000}),
    #{allocated := A1, live_tensors := L1, peak := P1} = fusex:memory(Device),
    ?assertEqual(A0 + 8000, A1),
    ?assertEqual(L0 + 1, L1),
    ?assert(P1 >= A1),
    fusex:free(T),
    ?assertMatch(#{allocated := A0, live_tensors := L0}, fusex:memory(Device)).

synchronize_test() ->
    T = tensor({f, 32}, {1}, [1.0]),
    ?assertEqual(ok, fusex:synchronize(T)),
    ?assertEqual(ok, fusex:synchronize(device())),
    ?assertEqual(ok, fusex:synchronize(cpu)).

%% synchronize waits for work of any length: within its polling rounds on
%% the calling scheduler (300 us of GPU busy-wait) and past them, where it
%% moves to a dirty IO scheduler (3 ms). It must not return before the work
%% is done: on CUDA the wall time from the launch is at least the kernel's.
synchronize_waits_for_long_work_test_() ->
    {timeout, 30,
     fun() ->
             Device = device(),
             [begin
                  T0 = erlang:monotonic_time(microsecond),
                  ok = fusex_nif:busy_wait(Device, Us),
                  ok = fusex:synchronize(Device),
                  Waited = erlang:monotonic_time(microsecond) - T0,
                  case Device of
                      cpu -> ok;
                      _ -> ?assert(Waited >= Us)
                  end
              end || Us <- [300, 3000, 300]]
     end}.

%% to_binary reads a result only after the work that writes it, whether it
%% polls on the calling scheduler (small tensors: 300 us of GPU work ahead)
%% or waits on dirty IO (past 1 ms of polling; tensors above 64 KB).
to_binary_waits_for_its_writer_test_() ->
    {timeout, 30,
     fun() ->
             Device = device(),
             [begin
                  Values = [float(I rem 1000) || I <- lists:seq(1, N)],
                  T = fusex:tensor(<< <<V:32/float-native>> || V <- Values >>, {f, 32}, {N},
                                   #{device => Device}),
                  ok = fusex_nif:busy_wait(Device, Us),
                  R = fusex:scale(T, 2.0),
                  Want = << <<(2 * V):32/float-native>> || V <- Values >>,
                  ?assertEqual(Want, fusex:to_binary(R)),
                  [fusex:free(X) || X <- [T, R]]
              end || {N, Us} <- [{1, 300}, {4000, 300}, {16384, 300}, {16385, 300},
                                 {1000, 3000}, {100000, 3000}]]
     end}.

%% ---- bad input: every kind raises a badarg naming the argument ----

bad_input_test_() ->
    Good = tensor({f, 32}, {3}, [1.0, 2.0, 3.0]),
    Ints = tensor({s, 32}, {3}, [1, 2, 3]),
    Four = tensor({f, 32}, {4}, [1.0, 2.0, 3.0, 4.0]),
    Cases =
        [{<<"tensor: expected a fusex tensor, got foo">>, fun() -> fusex:to_binary(foo) end},
         {{prefix, <<"tensor: expected a fusex tensor, got #Ref<">>},
          fun() -> fusex:shape(make_ref()) end},
         {<<"b: expected type {f,32}, got {s,32}">>, fun() -> fusex:add(Good, Ints) end},
         {<<"b: expected shape {3} (the shape of a), got {4}">>, fun() -> fusex:add(Good, Four) end},
         {<<"type: expected one of {f,32}, {f,64}, {bf,16}, {f,16}, {s,32}, {s,64}, {u,8}, got {f,8}">>,
          fun() -> fusex:tensor(<<>>, {f, 8}, {0}) end},
         {{prefix, <<"type: expected one of">>}, fun() -> fusex:zeros(float, {1}) end},
         {<<"data: expected a binary, got [1,2]">>, fun() -> fusex:tensor([1, 2], {u, 8}, {2}) end},
         {<<"data: expected a binary, got <<1:3>>">>,
          fun() -> fusex:tensor(<<1:3>>, {u, 8}, {1}) end},
         {<<"data: expected 12 bytes (shape {3} of {f,32}), got 8 bytes">>,
          fun() -> fusex:tensor(<<0:64>>, {f, 32}, {3}) end},
         {<<"data: expected 12 bytes (shape {3} of {f,32}), got 16 bytes">>,
          fun() -> fusex:tensor(<<0:128>>, {f, 32}, {3}) end},
         {<<"shape: expected a tuple of non-negative integers, got {2,-1}">>,
          fun() -> fusex:zeros({f, 32}, {2, -1}) end},
         {<<"shape: expected a tuple of non-negative integers, got [2,3]">>,
          fun() -> fusex:zeros({f, 32}, [2, 3]) end},
         {<<"shape: expected a tuple of non-negative integers, got {a}">>,
          fun() -> fusex:zeros({f, 32}, {a}) end},
         {<<"shape: expected a shape of at most 2^48 elements, got {1048576,1048576,1048576}">>,
          fun() -> fusex:zeros({f, 32}, {1 bsl 20, 1 bsl 20, 1 bsl 20}) end},
         {<<"shape: expected at most 2^48 bytes, got shape {281474976710656} of {f,32}">>,
          fun() -> fusex:zeros({f, 32}, {1 bsl 48}) end},
         {<<"shape: expected a tuple of non-negative integers, each at most 2^48, got {1180591620717411303424}">>,
          fun() -> fusex:zeros({f, 32}, {1 bsl 70}) end},
         {<<"shape: expected a tuple of non-negative integers, each at most 2^48, got {18446744073709551616}">>,
          fun() -> fusex:zeros({f, 32}, {1 bsl 64}) end},
         {<<"shape: expected a tuple of non-negative integers, got {-18446744073709551616}">>,
          fun() -> fusex:zeros({f, 32}, {-(1 bsl 64)}) end},
         {<<"shape: expected nonzero dimensions whose product is at most 2^48, got {281474976710656,0,4194304}">>,
          fun() -> fusex:zeros({f, 32}, {1 bsl 48, 0, 1 bsl 22}) end},
         {<<"factor: expected a float or an integer from -2^63 to 2^63-1, got 1180591620717411303424">>,
          fun() -> fusex:scale(Good, 1 bsl 70) end},
         {<<"factor: expected a float or an integer from -2^63 to 2^63-1, got -9223372036854775809">>,
          fun() -> fusex:scale(Good, -(1 bsl 63) - 1) end},
         {<<"shape: expected a rank of at most 8, got 9">>,
          fun() -> fusex:zeros({f, 32}, list_to_tuple(lists:duplicate(9, 1))) end},
         {<<"device: expected cpu, cuda or {cuda, N}, got tpu">>,
          fun() -> fusex:zeros({f, 32}, {1}, #{device => tpu}) end},
         {{prefix, <<"device: expected an available device, got {cuda,99}">>},
          fun() -> fusex:zeros({f, 32}, {1}, #{device => {cuda, 99}}) end},
         {<<"opts: expected only the options [device,ipc], got [devise]">>,
          fun() -> fusex:zeros({f, 32}, {1}, #{devise => cpu}) end},
         {<<"opts: expected a map, got [cpu]">>, fun() -> fusex:zeros({f, 32}, {1}, [cpu]) end},
         {<<"factor: expected a number, got two">>, fun() -> fusex:scale(Good, two) end},
         {{prefix, <<"tensor: expected a float type">>}, fun() -> fusex:scale(Ints, 2) end},
         {<<"device: expected cpu, cuda or {cuda, N}, got {cuda,-1}">>,
          fun() -> fusex:copy(Good, {cuda, -1}) end}],
    [{lists:flatten(io_lib:format("~p", [Expected])), fun() -> fusex_test_util:check_badarg(Expected, F) end}
     || {Expected, F} <- Cases].

%% xla_register/1's library name fills a 4096-byte path buffer in the NIF
%% with its NUL: one byte more is refused by name and size, by fusex and by
%% the NIF itself for a caller that skips fusex's checks; the longest that
%% fits is looked up (and, never loaded here, not found).
xla_register_library_length_test() ->
    TooLong = binary:copy(<<"a">>, 4096),
    Message = <<"library: expected a path or soname of at most 4095 bytes, got one of 4096 bytes">>,
    ?assertBadarg(Message, fusex:xla_register(TooLong)),
    ?assertBadarg(Message, fusex:xla_register(binary_to_list(TooLong))),
    ?assertBadarg(Message, fusex_nif:xla_register(TooLong)),
    ?assertBadarg(<<"library: expected a path or soname of at most 4095 bytes, got one of 8192 bytes">>,
                  fusex:xla_register(binary:copy(<<"é"/utf8>>, 4096))),
    Longest = binary:copy(<<"a">>, 4095),
    ?assertMatch({error, Why} when is_binary(Why), fusex:xla_register(Longest)),
    %% fusex refuses these before the NIF (fusex_xla_SUITE:bad_library);
    %% the NIF says the same
    ?assertBadarg(<<"library: expected the path or soname of a loaded XLA library, got <<>>">>,
                  fusex_nif:xla_register(<<>>)),
    ?assertBadarg(<<"library: expected the path or soname of a loaded XLA library, got <<97,0,98>>">>,
                  fusex_nif:xla_register(<<"a", 0, "b">>)),
    ?assertBadarg(<<"library: expected the path or soname of a loaded XLA library, got 42">>,
                  fusex_nif:xla_register(42)).

device_mismatch_test() ->
    case device() of
        cpu -> ok;
        Gpu ->
            OnGpu = tensor({f, 32}, {2}, [1.0, 2.0], Gpu),
            OnCpu = tensor({f, 32}, {2}, [1.0, 2.0], cpu),
            ?assertBadarg(<<"b: expected a tensor on cuda:0 (where a is), got one on cpu">>,
                          fusex:add(OnGpu, OnCpu))
    end.

tensor(Type, Shape, Values, Device) -> fusex_test_util:tensor(Type, Shape, Values, Device).

errors_leave_the_vm_working_test() ->
    [catch fusex:tensor(<<1>>, {f, 32}, {1}) || _ <- lists:seq(1, 1000)],
    T = tensor({f, 32}, {1}, [2.0]),
    ?assertEqual([4.0], values(fusex:add(T, T))).
