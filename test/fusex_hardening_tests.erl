%% EUnit: the reproducers of a hostile-input survey, each as it was
%% reported (one Erlang expression that crashed the VM, returned garbage or
%% pinned a scheduler), and the neighbours of each fix: a clean error or a
%% correct result, in bounded time.
-module(fusex_hardening_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, tensor/3, values/1]).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

z(Shape) -> fusex:zeros({f, 32}, Shape, #{device => device()}).

%% The values of every tensor in a map of gradients, by key.
grad_values(Grads) -> maps:map(fun(_, T) -> values(T) end, Grads).

all_zero(Values) -> lists:all(fun(V) -> V == 0 end, Values).

%% ---- 1. zero-element inputs whose other dimensions overflow ----

%% The reproducer scanned x = zeros({2^48, 0, 2^22}) (batch * dim * dstate
%% wrapped to 0 bytes of scratch). No such tensor can be made any more: a
%% shape's nonzero dimensions multiply to at most 2^48, so the scan is not
%% reached. zeros/2 refusing it is in fusex_tests:bad_input_test_; every
%% other way to make a tensor of a shape refuses it too.
zero_element_overflow_shapes_cannot_be_made_test() ->
    Shape = {1 bsl 48, 0, 1 bsl 22},
    Msg = <<"shape: expected nonzero dimensions whose product is at most 2^48, got {281474976710656,0,4194304}">>,
    ?assertError({badarg, Msg}, fusex:tensor(<<>>, {f, 32}, Shape, #{device => device()})),
    ?assertError({badarg, Msg}, fusex:reshape(z({0}), Shape)),
    {local, A, _} = fusex:to_pointer(z({4}), local),
    ?assertError({badarg, Msg}, fusex:from_pointer({local, A}, {f, 32}, Shape, #{device => device()})).

%% An empty sequence over many channels: nothing is scanned, so the
%% gradients are zeros of their inputs' shapes (and dh0 is dstate).
empty_sequence_gradients_test_() ->
    {timeout, 60,
     fun() ->
             Bt = 1 bsl 20, D = 1 bsl 10, N = 3,
             H0 = tensor({f, 32}, {2, D, N}, [float(I) || I <- lists:seq(1, 2 * D * N)]),
             Dstate = tensor({f, 32}, {2, D, N}, [float(-I) || I <- lists:seq(1, 2 * D * N)]),
             Opts = #{d => z({D}), dt_bias => z({D}), z => z({Bt, 0, D}), save_for_backward => true},
             {Y, C} = fusex:selective_scan(z({Bt, 0, D}), z({Bt, 0, D}), z({D, N}), z({Bt, 0, 2, N}),
                                           z({Bt, 0, 2, N}), Opts),
             ?assertEqual({Bt, 0, D}, fusex:shape(Y)),
             G = fusex:selective_scan_backward(Y, C),
             ?assertEqual([a, b, c, d, dt, dt_bias, x, z], lists:sort(maps:keys(G))),
             ?assertEqual({D, N}, fusex:shape(maps:get(a, G))),
             ?assert(lists:all(fun all_zero/1, maps:values(grad_values(G)))),
             %% a sequence of no steps carries h0 to the final state, and
             %% the final state's gradient back to h0
             X2 = z({2, 0, D}), B2 = z({2, 0, 1, N}),
             {Y2, S2, C2} = fusex:selective_scan(X2, X2, z({D, N}), B2, B2,
                                                 #{h0 => H0, return_state => true,
                                                   save_for_backward => true}),
             ?assertEqual(values(H0), values(S2)),
             G2 = fusex:selective_scan_backward(Y2, C2, #{dstate => Dstate}),
             ?assertEqual(values(Dstate), values(maps:get(h0, G2))),
             ?assert(all_zero(values(maps:get(a, G2))))
     end}.

%% No channels (dim 0) but groups of b and c with states: their gradients
%% are sums over no channels, zeros.
no_channels_test() ->
    {Y, C} = fusex:selective_scan(z({2, 3, 0}), z({2, 3, 0}), z({0, 4}), z({2, 3, 5, 4}), z({2, 3, 5, 4}),
                                  #{save_for_backward => true}),
    G = fusex:selective_scan_backward(Y, C),
    ?assertEqual({2, 3, 5, 4}, fusex:shape(maps:get(b, G))),
    ?assert(all_zero(values(maps:get(b, G)))),
    ?assert(all_zero(values(maps:get(c, G)))).

%% ---- 4. an empty output over 2^40 batch rows ----

%% It used to loop over every row (~100 hours on a dirty scheduler); the
%% op now returns at once, forward and backward, also with many groups.
empty_output_returns_at_once_test_() ->
    {timeout, 30,
     fun() ->
             X = z({1 bsl 40, 0, 64}), B = z({1 bsl 40, 0, 1}),
             {T, Y} = timer:tc(fun() -> fusex:selective_scan(X, X, z({64, 1}), B, B, #{}) end),
             ?assertEqual({1 bsl 40, 0, 64}, fusex:shape(Y)),
             ?assert(T < 5000000),
             {Y1, C1} = fusex:selective_scan(X, X, z({64, 1}), B, B, #{save_for_backward => true}),
             ?assertEqual(#{x => {1 bsl 40, 0, 64}, a => {64, 1}},
                          maps:map(fun(_, G) -> fusex:shape(G) end,
                                   maps:with([x, a], fusex:selective_scan_backward(Y1, C1)))),
             Xg = z({1, 0, 1 bsl 20}), Bg = z({1, 0, 1 bsl 20, 1}),
             {Y2, C2} = fusex:selective_scan(Xg, Xg, z({1 bsl 20, 1}), Bg, Bg, #{save_for_backward => true}),
             G2 = fusex:selective_scan_backward(Y2, C2),
             ?assert(all_zero(values(maps:get(a, G2))))
     end}.

%% A step of no channels, or of no batch rows, is empty too.
empty_step_test() ->
    Y = fusex:selective_scan_step(z({3, 0, 8}), z({3, 0}), z({3, 0}), z({0, 8}), z({3, 8}), z({3, 8}), #{}),
    ?assertEqual({3, 0}, fusex:shape(Y)),
    Y0 = fusex:selective_scan_step(z({0, 4, 8}), z({0, 4}), z({0, 4}), z({4, 8}), z({0, 8}), z({0, 8}), #{}),
    ?assertEqual({0, 4}, fusex:shape(Y0)).

%% ---- 3. liquid_backward of hidden 0 returned dt's gradient unwritten ----

%% The heap is first filled with freed 0xFF tensors of the gradient's size,
%% so memory nobody writes reads as NaN, not as the zeros of a fresh page.
liquid_empty_dt_gradient_test() ->
    Poison = fun() -> [fusex:free(fusex:tensor(binary:copy(<<255>>, 4000), {u, 8}, {4000},
                                               #{device => device()}))
                       || _ <- lists:seq(1, 8)] end,
    [begin
         Poison(),
         {_, C} = fusex:liquid(z({4, 250, 0}), z({0}), z({0}),
                               #{dt => z({4, 250, 1}), save_for_backward => true}),
         Poison(),
         G = fusex:liquid_backward(z({4, 250, 0}), C),
         ?assertEqual(lists:duplicate(1000, 0.0), values(maps:get(dt, G))),
         ?assertEqual([], values(maps:get(tau, G)))
     end || _ <- lists:seq(1, 5)].

%% The op layer's emptiness test once formed batch * hidden past 2^64; no
%% shape holds such dimensions any more (as in the test above). A
%% zero-element sequence whose batch * hidden is 2^48, the most a shape
%% allows, scans nothing.
linrec_empty_sequence_of_largest_shape_test() ->
    H = fusex:linear_scan(z({1 bsl 26, 0, 1 bsl 22}), z({1 bsl 26, 0, 1 bsl 22})),
    ?assertEqual({1 bsl 26, 0, 1 bsl 22}, fusex:shape(H)).

%% ---- 5. copy_into between overlapping views ----

%% Views of one tensor's memory at different offsets: the copy behaves as
%% memmove (memcpy on overlapping ranges is undefined; AddressSanitizer
%% reports memcpy-param-overlap, which is how make test-asan catches it).
copy_into_overlapping_views_test_() ->
    case device() of
        cpu -> [{Name, fun() -> overlap_case(N, Shift) end}
                || {Name, N, Shift} <- [{"forward by 2", 8, 2}, {"backward by 2", 8, -2},
                                        {"forward by 1 of 100001", 100001, 1},
                                        {"backward by 3 of 100001", 100001, -3}]];
        _ -> [] % local addresses of CUDA memory are device addresses: same code path, tested on cpu
    end.

overlap_case(N, Shift) ->
    Values = [float(I) || I <- lists:seq(1, N)],
    T = tensor({f, 32}, {N}, Values),
    {local, A, _} = fusex:to_pointer(T, local),
    Len = N - abs(Shift),
    {SrcAt, DstAt} = case Shift > 0 of true -> {0, Shift}; false -> {-Shift, 0} end,
    View = fun(At) -> fusex:from_pointer({local, A + 4 * At}, {f, 32}, {Len}, #{device => cpu}) end,
    ok = fusex:copy_into(View(SrcAt), View(DstAt)),
    Src = lists:sublist(Values, SrcAt + 1, Len),
    Want = lists:sublist(Values, DstAt) ++ Src ++ lists:nthtail(DstAt + Len, Values),
    ?assertEqual(Want, values(T)).

%% A step's state is written in place while its inputs are read: a state
%% that shares bytes with one of them is refused.
step_state_apart_from_inputs_test() ->
    S = z({2, 4, 3}),
    X = fusex:reshape(S, {2, 12}),
    {local, A, _} = fusex:to_pointer(S, local),
    Xv = fusex:from_pointer({local, A}, {f, 32}, {2, 4}, #{device => device()}),
    ?assertError({badarg, <<"state: expected memory apart from x's (it is written in place while x is read), "
                            "got an overlap of their bytes">>},
                 fusex:selective_scan_step(S, Xv, z({2, 4}), z({4, 3}), z({2, 3}), z({2, 3}), #{})),
    L = z({2, 12}),
    ?assertError({badarg, <<"state: expected memory apart from b's (it is written in place while b is read), "
                            "got an overlap of their bytes">>},
                 fusex:linear_scan_step(L, z({2, 12}), L, #{})),
    ?assertError({badarg, <<"state: expected memory apart from a's (it is written in place while a is read), "
                            "got an overlap of their bytes">>},
                 fusex:linear_scan_step(X, X, z({2, 12}), #{})).

%% ---- 6. aliasing checks compare byte ranges, from any source ----

optimizer_aliasing_by_ranges_test() ->
    T = tensor({f, 32}, {8}, [float(I) || I <- lists:seq(1, 8)]),
    {local, A, _} = fusex:to_pointer(T, local),
    Shifted = fusex:from_pointer({local, A + 4}, {f, 32}, {7}, #{device => device()}),
    ?assertError({badarg, <<"params[1]: expected a tensor distinct from params[0], got overlapping memory">>},
                 fusex:adamw_init([T, Shifted], #{})),
    ?assertError({badarg, <<"params[1]: expected a tensor distinct from params[0], got overlapping memory">>},
                 fusex:sgd_init([T, Shifted], #{momentum => 0.9})),
    P = [tensor({f, 32}, {3}, [1.0, 2.0, 3.0]), tensor({f, 32}, {4}, [4.0, 5.0, 6.0, 7.0])],
    G = [z({3}), z({4})],
    S = fusex:adamw_init(P, #{amsgrad => true}),
    #{exp_avg := [M0, _], exp_avg_sq := [_, V1], max_exp_avg_sq := [Max0, _]} = S,
    %% the state's own moments as gradients or as parameters
    ?assertError({badarg, <<"grads[0]: expected a tensor distinct from every param and the optimizer "
                            "state's tensors, got the memory of the state's exp_avg[0]">>},
                 fusex:adamw_step(S, P, [M0, lists:last(G)], #{amsgrad => true})),
    ?assertError({badarg, <<"params[0]: expected a tensor distinct from the optimizer state's tensors, "
                            "got the memory of the state's max_exp_avg_sq[0]">>},
                 fusex:adamw_step(S, [Max0, lists:last(P)], G, #{amsgrad => true})),
    %% a view into a moment, made from its address
    {local, AV, _} = fusex:to_pointer(V1, local),
    Inside = fusex:from_pointer({local, AV + 4}, {f, 32}, {3}, #{device => device()}),
    ?assertError({badarg, <<"grads[0]: expected a tensor distinct from every param and the optimizer "
                            "state's tensors, got the memory of the state's exp_avg_sq[1]">>},
                 fusex:adamw_step(S, P, [Inside, lists:last(G)], #{amsgrad => true})),
    %% a gradient overlapping a param's tail
    [_, P1] = P,
    {local, AP, _} = fusex:to_pointer(P1, local),
    Tail = fusex:from_pointer({local, AP + 4}, {f, 32}, {3}, #{device => device()}),
    ?assertError({badarg, <<"grads[0]: expected a tensor distinct from every param, got the memory of params[1]">>},
                 fusex:adamw_step(S, P, [Tail, lists:last(G)], #{amsgrad => true})),
    %% none of that changed the state; a good step still runs
    ?assertMatch(#{step := 0}, fusex:optimizer_info(S)),
    fusex:adamw_step(S, P, G, #{amsgrad => true}),
    ?assertMatch(#{step := 1}, fusex:optimizer_info(S)),
    %% SGD's momentum buffers as gradients
    Sg = fusex:sgd_init(P, #{momentum => 0.9}),
    #{momentum_buffer := [B0, _]} = Sg,
    ?assertError({badarg, <<"grads[0]: expected a tensor distinct from every param and the optimizer "
                            "state's tensors, got the memory of the state's momentum_buffer[0]">>},
                 fusex:sgd_step(Sg, P, [B0, lists:last(G)], #{})).

%% ---- 7. forged state maps ----

%% optimizer_info and the steps read the state through its `ref' alone:
%% tensors swapped into the map change nothing, and a `ref' that is not a
%% state is refused.
forged_optimizer_state_test() ->
    P = [tensor({f, 32}, {3}, [1.0, 2.0, 3.0])],
    G = [tensor({f, 32}, {3}, [0.5, 0.5, 0.5])],
    S = fusex:adamw_init(P, #{max_grad_norm => 10.0}),
    fusex:adamw_step(S, P, G, #{}),
    Want = fusex:optimizer_info(S),
    ?assertMatch(#{step := 1, skipped := false, grad_norm := N} when is_float(N), Want),
    F32 = tensor({f, 32}, {}, [7.0]),
    F64 = fusex:tensor(<<1.5:64/float-native>>, {f, 64}, {}, #{device => device()}),
    ?assertEqual(Want, fusex:optimizer_info(S#{step => F32})),
    ?assertEqual(Want, fusex:optimizer_info(S#{grad_norm => F64, skipped => F32})),
    Forged = S#{step => F32, exp_avg => [F32], master => [F64]},
    fusex:adamw_step(Forged, P, G, #{}),
    ?assertMatch(#{step := 2}, fusex:optimizer_info(Forged)),
    ?assertError({badarg, <<"state: expected a context saved by adamw_init/2 or sgd_init/2, got ", _/binary>>},
                 fusex:optimizer_info(S#{ref => make_ref()})),
    ?assertError({badarg, <<"state: expected a context saved by adamw_init/2 or sgd_init/2, got ", _/binary>>},
                 fusex:adamw_step(S#{ref => F32}, P, G, #{})),
    ?assertError({badarg, <<"state: expected an optimizer state from adamw_init/2 or sgd_init/2, got ", _/binary>>},
                 fusex:optimizer_info(#{step => F32})).

%% ---- 4b. killing the caller of a long CPU scan frees its scheduler ----

%% As many scans of minutes as there are dirty CPU schedulers, their
%% callers killed mid-call: the scans notice and stop, so a small CPU op
%% right after gets a scheduler at once (it waited for minutes before).
killed_callers_free_the_dirty_schedulers_test_() ->
    {timeout, 120,
     fun() ->
             Cpu = #{device => cpu},
             Zc = fun(S) -> fusex:zeros({f, 32}, S, Cpu) end,
             {L, D, N} = {1 bsl 16, 1 bsl 10, 1 bsl 10}, % 2^36 state-steps: seconds on the fast path, minutes on the oracle
             X = Zc({1, L, D}), A = Zc({D, N}), B = Zc({1, L, N}),
             Jobs = [spawn(fun() -> fusex:selective_scan(X, X, A, B, B, #{}) end)
                     || _ <- lists:seq(1, erlang:system_info(dirty_cpu_schedulers))],
             timer:sleep(300),
             [exit(P, kill) || P <- Jobs],
             {T, Sum} = timer:tc(fun() -> values(fusex:add(Zc({2}), Zc({2}))) end),
             ?assertEqual([0.0, 0.0], Sum),
             %% a poll every few thousand steps: instrumented (ASan) loops
             %% take ~10x as long to reach one, the whole scan minutes
             Limit = case os:getenv("FUSEX_ASAN") of
                         false -> 5000000;
                         _ -> 30000000
                     end,
             ?assert(T < Limit)
     end}.

%% ---- 8. integers beyond 64 bits: the message says the limit ----

%% In options (a factor and a shape are in fusex_tests:bad_input_test_).
big_integer_option_messages_test() ->
    T = z({2}),
    ?assertError({badarg, <<"lr: expected a float or an integer from -2^63 to 2^63-1, got 36893488147419103232">>},
                 fusex:adamw_init([T], #{lr => 1 bsl 65})),
    ?assertError({badarg, <<"dt: expected a float or an integer from -2^63 to 2^63-1, got 36893488147419103232">>},
                 fusex:liquid(z({1, 1, 2}), z({2}), z({2}), #{dt => 1 bsl 65})).
