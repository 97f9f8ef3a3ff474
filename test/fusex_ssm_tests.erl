%% EUnit: the selective scan's Erlang API on the device under test
%% (FUSEX_DEVICE): results against a pure-Erlang reference, result shapes
%% for every option, a split scan with the state carried, steps against one
%% call, backward keys, shapes and types, a gradient against finite
%% differences, and every bad input with its message.
-module(fusex_ssm_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, tensor/3, values/1]).

-define(assertBadarg(Msg, Expr), ?assertError({badarg, Msg}, Expr)).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

%% ---- inputs and the pure-Erlang reference ----

%% Random inputs as flat lists; Opts lists the options to include.
inputs({Bt, L, D, N, G}, Opts) ->
    Btd = Bt * L * D,
    In = #{shape => {Bt, L, D, N, G},
           x => fusex_test_util:normal(Btd),
           dt => case lists:member(dt_softplus, Opts) of
                     true -> fusex_test_util:uniform(Btd, -4.0, 1.0);
                     false -> fusex_test_util:uniform(Btd, 0.01, 0.6)
                 end,
           a => fusex_test_util:uniform(D * N, -3.0, -0.05),
           b => fusex_test_util:normal(Bt * L * G * N),
           c => fusex_test_util:normal(Bt * L * G * N),
           dt_softplus => lists:member(dt_softplus, Opts)},
    Optional = #{d => fun() -> fusex_test_util:normal(D) end,
                 z => fun() -> fusex_test_util:normal(Btd) end,
                 dt_bias => fun() -> fusex_test_util:uniform(D, 0.0, 0.3) end,
                 h0 => fun() -> fusex_test_util:normal(Bt * D * N) end},
    maps:merge(In, maps:from_list([{K, F()} || {K, F} <- maps:to_list(Optional),
                                                lists:member(K, Opts)])).

%% Rounds every list to what Type keeps, so the reference sees the values
%% the device sees.
rounded(In, Type) ->
    maps:map(fun(_, V) when is_list(V) ->
                     fusex_test_util:decode(Type, fusex_test_util:encode(Type, V));
                (_, V) -> V
             end, In).

shape_of(K, {Bt, L, D, N, G}) ->
    case K of
        x -> {Bt, L, D}; dt -> {Bt, L, D}; z -> {Bt, L, D};
        a -> {D, N};
        b when G > 1 -> {Bt, L, G, N}; c when G > 1 -> {Bt, L, G, N};
        b -> {Bt, L, N}; c -> {Bt, L, N};
        d -> {D}; dt_bias -> {D};
        h0 -> {Bt, D, N}
    end.

%% The tensors of In on the device, as {X, Dt, A, B, C, OptsMap}.
tensors(In = #{shape := S}, Type, Extra) ->
    T = fun(K) -> tensor(Type, shape_of(K, S), maps:get(K, In)) end,
    Opts = maps:merge(maps:from_list([{K, T(K)} || K <- [d, z, dt_bias, h0], is_map_key(K, In)]),
                      #{dt_softplus => maps:get(dt_softplus, In)}),
    {T(x), T(dt), T(a), T(b), T(c), maps:merge(Opts, Extra)}.

scan(In, Type, Extra) ->
    {X, Dt, A, B, C, Opts} = tensors(In, Type, Extra),
    fusex:selective_scan(X, Dt, A, B, C, Opts).

%% {Ys, FinalState} as flat lists, straight from the equations.
reference(In = #{shape := Shape}) ->
    Opts = [K || K <- [d, z, dt_bias, h0], is_map_key(K, In)] ++ [dt_softplus || maps:get(dt_softplus, In)],
    fusex_test_util:ssm_reference(Shape, In, Opts).

tolerance({f, 32}) -> 1.0e-5;
tolerance({f, 64}) -> 1.0e-12;
tolerance(_) -> 1.0e-2.

%% ---- forward ----

forward_matches_reference_test_() ->
    Cases = [{{1, 1, 1, 1, 1}, []},
             {{2, 5, 3, 4, 1}, [d, z]},
             {{1, 33, 8, 16, 2}, [d, z, dt_bias, dt_softplus, h0]},
             {{3, 7, 4, 3, 4}, [dt_softplus, h0]},
             {{2, 40, 6, 2, 1}, [dt_bias, z]}],
    Types = [{f, 32}, {bf, 16}] ++ [{f, 64} || device() =:= cpu],
    [{lists:flatten(io_lib:format("~p ~p ~p", [S, O, Type])),
      fun() ->
              In = rounded(inputs(S, O), Type),
              {Y, State} = scan(In, Type, #{return_state => true}),
              {WantY, WantState} = reference(In),
              fusex_test_util:assert_close(values(Y), WantY, tolerance(Type)),
              fusex_test_util:assert_close(values(State), WantState,
                                           case Type of {f, 64} -> 1.0e-12; _ -> 1.0e-5 end)
      end} || {S, O} <- Cases, Type <- Types].

result_shapes_test() ->
    S = {Bt, L, D, N, _} = {2, 3, 4, 5, 1},
    In = rounded(inputs(S, [d]), {bf, 16}),
    Y = scan(In, {bf, 16}, #{}),
    ?assert(is_reference(Y)),
    ?assertEqual({Bt, L, D}, fusex:shape(Y)),
    ?assertEqual({bf, 16}, fusex:type(Y)),
    {Y2, State} = scan(In, {bf, 16}, #{return_state => true}),
    ?assertEqual({Bt, D, N}, fusex:shape(State)),
    ?assertEqual({f, 32}, fusex:type(State)),
    ?assertEqual(values(Y), values(Y2)),
    {Y3, Ctx} = scan(In, {bf, 16}, #{save_for_backward => true}),
    ?assert(is_reference(Ctx)),
    ?assertEqual(values(Y), values(Y3)),
    {Y4, State4, _} = scan(In, {bf, 16}, #{return_state => true, save_for_backward => true}),
    ?assertEqual(values(Y), values(Y4)),
    ?assertEqual(values(State), values(State4)),
    %% false options are the same as absent ones
    ?assertEqual(values(Y), values(scan(In, {bf, 16}, #{return_state => false,
                                                        save_for_backward => false}))).

%% Two calls, the second starting from the first's state, equal one call.
split_with_carried_state_test() ->
    {Bt, L, D, N, G} = S = {2, 20, 8, 4, 2},
    Split = 7,
    In = rounded(inputs(S, [d, z, dt_bias, dt_softplus, h0]), {f, 32}),
    {Y, State} = scan(In, {f, 32}, #{return_state => true}),
    Part = fun(K, Width, From, Len) ->
                   V = maps:get(K, In),
                   lists:append([lists:sublist(V, (B * L + From) * Width + 1, Len * Width)
                                 || B <- lists:seq(0, Bt - 1)])
           end,
    Half = fun(From, Len) ->
                   maps:merge(In, #{shape => {Bt, Len, D, N, G},
                                    x => Part(x, D, From, Len), dt => Part(dt, D, From, Len),
                                    z => Part(z, D, From, Len), b => Part(b, G * N, From, Len),
                                    c => Part(c, G * N, From, Len)})
           end,
    {Y1, S1} = scan(Half(0, Split), {f, 32}, #{return_state => true}),
    {X2, Dt2, A2, B2, C2, Opts2} = tensors(Half(Split, L - Split), {f, 32}, #{return_state => true}),
    {Y2, S2} = fusex:selective_scan(X2, Dt2, A2, B2, C2, Opts2#{h0 => S1}),
    Rows = fun(T, Len) -> V = values(T),
                          [lists:sublist(V, B * Len * D + 1, Len * D) || B <- lists:seq(0, Bt - 1)]
           end,
    Joined = lists:append([R1 ++ R2 || {R1, R2} <- lists:zip(Rows(Y1, Split), Rows(Y2, L - Split))]),
    fusex_test_util:assert_close(Joined, values(Y), 1.0e-5),
    fusex_test_util:assert_close(values(S2), values(State), 1.0e-5).

%% ---- steps ----

step_by_step_equals_one_call_test_() ->
    [{lists:flatten(io_lib:format("~p", [S])), fun() -> steps(S) end}
     || S <- [{2, 6, 8, 4, 1}, {1, 5, 6, 16, 3}, {3, 4, 5, 1, 1}]].

steps(S = {Bt, L, D, N, G}) ->
    In = rounded(inputs(S, [d, z, dt_bias, dt_softplus, h0]), {f, 32}),
    {Y, Final} = scan(In, {f, 32}, #{return_state => true}),
    State = tensor({f, 32}, {Bt, D, N}, maps:get(h0, In)),
    Frame = fun(K, Width, T) ->
                    V = maps:get(K, In),
                    lists:append([lists:sublist(V, (B * L + T) * Width + 1, Width)
                                  || B <- lists:seq(0, Bt - 1)])
            end,
    BShape = case G of 1 -> {Bt, N}; _ -> {Bt, G, N} end,
    Opts = #{d => tensor({f, 32}, {D}, maps:get(d, In)),
             dt_bias => tensor({f, 32}, {D}, maps:get(dt_bias, In)), dt_softplus => true},
    A = tensor({f, 32}, {D, N}, maps:get(a, In)),
    Ys = [begin
              Yt = fusex:selective_scan_step(
                     State, tensor({f, 32}, {Bt, D}, Frame(x, D, T)),
                     tensor({f, 32}, {Bt, D}, Frame(dt, D, T)), A,
                     tensor({f, 32}, BShape, Frame(b, G * N, T)),
                     tensor({f, 32}, BShape, Frame(c, G * N, T)),
                     Opts#{z => tensor({f, 32}, {Bt, D}, Frame(z, D, T))}),
              ?assertEqual({Bt, D}, fusex:shape(Yt)),
              values(Yt)
          end || T <- lists:seq(0, L - 1)],
    %% Ys is [time][batch * dim]; Y is [batch][time][dim]
    Stepped = lists:append([lists:sublist(Row, B * D + 1, D)
                            || B <- lists:seq(0, Bt - 1), Row <- Ys]),
    fusex_test_util:assert_close(Stepped, values(Y), 1.0e-5),
    fusex_test_util:assert_close(values(State), values(Final), 1.0e-5).

%% ---- backward ----

backward_keys_shapes_and_types_test_() ->
    All = [d, z, dt_bias, dt_softplus, h0],
    [{lists:flatten(io_lib:format("~p", [Opts])),
      fun() ->
              S = {2, 9, 4, 3, 2},
              In = rounded(inputs(S, Opts), {bf, 16}),
              {X, Dt, A, B, C, TOpts} = tensors(In, {bf, 16}, #{save_for_backward => true}),
              {_Y, Ctx} = fusex:selective_scan(X, Dt, A, B, C, TOpts),
              Dy = tensor({bf, 16}, {2, 9, 4}, fusex_test_util:normal(72)),
              Grads = fusex:selective_scan_backward(Dy, Ctx),
              Given = [K || K <- [d, z, dt_bias, h0], lists:member(K, Opts)],
              ?assertEqual(lists:sort([x, dt, a, b, c | Given]), lists:sort(maps:keys(Grads))),
              Inputs = maps:merge(#{x => X, dt => Dt, a => A, b => B, c => C},
                                  maps:with(Given, TOpts)),
              [begin
                   ?assertEqual(fusex:shape(maps:get(K, Inputs)), fusex:shape(G)),
                   ?assertEqual(fusex:type(maps:get(K, Inputs)), fusex:type(G)),
                   ?assert(lists:all(fun is_float/1, values(G)))
               end || {K, G} <- maps:to_list(Grads)],
              %% the context serves a second backward, with a state gradient
              DState = tensor({f, 32}, {2, 4, 3}, fusex_test_util:normal(24)),
              Grads2 = fusex:selective_scan_backward(Dy, Ctx, #{dstate => DState}),
              ?assertEqual(maps:keys(Grads), maps:keys(Grads2))
      end} || Opts <- [[], All, [d, h0], [z, dt_bias]]].

%% Through the whole API on the CPU in f64: a handful of gradient elements
%% of every input against central differences of sum(Y * Dy) + sum(State * Ds).
backward_matches_finite_differences_test() ->
    S = {2, 6, 4, 3, 2},
    Opts = [d, z, dt_bias, dt_softplus, h0],
    In = inputs(S, Opts),
    Dy = fusex_test_util:normal(2 * 6 * 4),
    Ds = fusex_test_util:normal(2 * 4 * 3),
    Cpu = fun(K, V) -> fusex_test_util:tensor({f, 64}, shape_of(K, S), V, cpu) end,
    Run = fun(Inputs, Extra) ->
                  T = fun(K) -> Cpu(K, maps:get(K, Inputs)) end,
                  fusex:selective_scan(T(x), T(dt), T(a), T(b), T(c),
                                       maps:merge(maps:from_list([{K, T(K)} || K <- [d, z, dt_bias, h0]]),
                                                  Extra#{dt_softplus => true}))
          end,
    Loss = fun(Inputs) ->
                   {Y, State} = Run(Inputs, #{return_state => true}),
                   lists:sum([A * B || {A, B} <- lists:zip(values(Y), Dy)]) +
                       lists:sum([A * B || {A, B} <- lists:zip(values(State), Ds)])
           end,
    {_, Ctx} = Run(In, #{save_for_backward => true}),
    Grads = fusex:selective_scan_backward(fusex_test_util:tensor({f, 64}, {2, 6, 4}, Dy, cpu), Ctx,
                                          #{dstate => fusex_test_util:tensor({f, 64}, {2, 4, 3}, Ds, cpu)}),
    Eps = 1.0e-6,
    [begin
         V = maps:get(K, In),
         Analytic = values(maps:get(K, Grads)),
         Picks = lists:usort([rand:uniform(length(V)) || _ <- lists:seq(1, 4)]),
         Fd = [(Loss(In#{K => set(V, I, lists:nth(I, V) + Eps)}) -
                Loss(In#{K => set(V, I, lists:nth(I, V) - Eps)})) / (2 * Eps) || I <- Picks],
         fusex_test_util:assert_close([lists:nth(I, Analytic) || I <- Picks], Fd, 1.0e-6)
     end || K <- [x, dt, a, b, c, d, z, dt_bias, h0]].

set(List, I, V) -> lists:sublist(List, I - 1) ++ [V | lists:nthtail(I, List)].

%% The context keeps the inputs' memory: freeing them does not break the
%% backward.
context_outlives_freed_inputs_test() ->
    S = {1, 4, 3, 2, 1},
    In = rounded(inputs(S, [d]), {f, 32}),
    {X, Dt, A, B, C, Opts} = tensors(In, {f, 32}, #{save_for_backward => true}),
    {_, Ctx} = fusex:selective_scan(X, Dt, A, B, C, Opts),
    [ok = fusex:free(T) || T <- [X, Dt, A, B, C, maps:get(d, Opts)]],
    Grads = fusex:selective_scan_backward(tensor({f, 32}, {1, 4, 3}, lists:duplicate(12, 1.0)), Ctx),
    ?assertEqual([a, b, c, d, dt, x], lists:sort(maps:keys(Grads))).

%% ---- bad input ----

bad_input_test_() ->
    S = {2, 3, 8, 4, 1},
    In = rounded(inputs(S, [d, z]), {f, 32}),
    {X, Dt, A, B, C, Opts} = tensors(In, {f, 32}, #{}),
    Bad = fun(Shape) -> fusex:zeros({f, 32}, Shape, #{device => device()}) end,
    Freed = Bad({2, 3, 8}),
    fusex:free(Freed),
    {_, Ctx} = fusex:selective_scan(X, Dt, A, B, C, #{save_for_backward => true}),
    Scan = fun(Args) -> apply(fusex, selective_scan, Args) end,
    State = fusex:zeros({f, 32}, {2, 8, 4}, #{device => device()}),
    X2 = Bad({2, 8}),
    B2 = Bad({2, 4}),
    Cases =
        [{<<"x: expected a fusex tensor, got foo">>, fun() -> Scan([foo, Dt, A, B, C, #{}]) end},
         {<<"x: expected a live tensor, got one released by fusex:free/1">>,
          fun() -> Scan([Freed, Dt, A, B, C, #{}]) end},
         {<<"opts: expected a map, got [1]">>, fun() -> Scan([X, Dt, A, B, C, [1]]) end},
         {<<"opts: expected only the options d, z, dt_bias, dt_softplus, h0, return_state, "
            "save_for_backward, got gate">>, fun() -> Scan([X, Dt, A, B, C, #{gate => 1}]) end},
         {<<"d: expected a fusex tensor, got 3">>, fun() -> Scan([X, Dt, A, B, C, #{d => 3}]) end},
         {<<"dt_softplus: expected true or false, got 1">>,
          fun() -> Scan([X, Dt, A, B, C, #{dt_softplus => 1}]) end},
         {<<"return_state: expected true or false, got yes">>,
          fun() -> Scan([X, Dt, A, B, C, #{return_state => yes}]) end},
         {<<"x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,8}">>,
          fun() -> Scan([X2, Dt, A, B, C, #{}]) end},
         {<<"dt: expected shape {2,3,8} [batch, seqlen, dim], got {2,3,7}">>,
          fun() -> Scan([X, Bad({2, 3, 7}), A, B, C, #{}]) end},
         {<<"dt: expected type {f,32}, got {bf,16}">>,
          fun() -> Scan([X, fusex:convert(Dt, {bf, 16}), A, B, C, #{}]) end},
         {<<"a: expected shape {8,4} [dim, dstate], got {7,4}">>,
          fun() -> Scan([X, Dt, Bad({7, 4}), B, C, #{}]) end},
         {<<"a: expected rank 2 [dim, dstate], got rank 1 shape {8}">>,
          fun() -> Scan([X, Dt, Bad({8}), B, C, #{}]) end},
         {<<"b: expected shape {2,3,4} [batch, seqlen, dstate], got {2,3,5}">>,
          fun() -> Scan([X, Dt, A, Bad({2, 3, 5}), C, #{}]) end},
         {<<"b: expected a number of groups that divides dim 8 [batch, seqlen, groups, dstate], got 3">>,
          fun() -> Scan([X, Dt, A, Bad({2, 3, 3, 4}), Bad({2, 3, 3, 4}), #{}]) end},
         {<<"c: expected shape {2,3,4} (the shape of b), got {2,3,1,4}">>,
          fun() -> Scan([X, Dt, A, B, Bad({2, 3, 1, 4}), #{}]) end},
         {<<"z: expected shape {2,3,8} [batch, seqlen, dim], got {2,3}">>,
          fun() -> Scan([X, Dt, A, B, C, #{z => Bad({2, 3})}]) end},
         {<<"dt_bias: expected shape {8} [dim], got {4}">>,
          fun() -> Scan([X, Dt, A, B, C, #{dt_bias => Bad({4})}]) end},
         {<<"h0: expected shape {2,8,4} [batch, dim, dstate], got {2,4,8}">>,
          fun() -> Scan([X, Dt, A, B, C, #{h0 => Bad({2, 4, 8})}]) end},
         {<<"dy: expected shape {2,3,8} [batch, seqlen, dim], got {2,3}">>,
          fun() -> fusex:selective_scan_backward(Bad({2, 3}), Ctx) end},
         {<<"dy: expected type {f,32}, got {bf,16}">>,
          fun() -> fusex:selective_scan_backward(fusex:convert(X, {bf, 16}), Ctx) end},
         {<<"dstate: expected shape {2,8,4} [batch, dim, dstate], got {2,8}">>,
          fun() -> fusex:selective_scan_backward(X, Ctx, #{dstate => X2}) end},
         {<<"opts: expected only the options dstate, got dh">>,
          fun() -> fusex:selective_scan_backward(X, Ctx, #{dh => X2}) end},
         {{prefix, <<"ctx: expected a context saved by selective_scan, got #Ref<">>},
          fun() -> fusex:selective_scan_backward(X, make_ref()) end},
         {{prefix, <<"ctx: expected a context saved by selective_scan, got #Ref<">>},
          fun() -> fusex:selective_scan_backward(X, X) end},
         {<<"state: expected type {f,32}", (case device() of cpu -> <<" or {f,64}">>; _ -> <<>> end)/binary,
            ", got {bf,16}">>,
          fun() -> fusex:selective_scan_step(fusex:convert(State, {bf, 16}), X2, X2, A, B2, B2, #{}) end},
         {<<"state: expected shape {2,8,4} [batch, dim, dstate], got {2,3,8}">>,
          fun() -> fusex:selective_scan_step(X, X2, X2, A, B2, B2, #{}) end},
         {<<"x: expected rank 2 [batch, dim], got rank 3 shape {2,3,8}">>,
          fun() -> fusex:selective_scan_step(State, X, X2, A, B2, B2, #{}) end},
         {<<"b: expected shape {2,4} [batch, dstate], got {2,5}">>,
          fun() -> fusex:selective_scan_step(State, X2, X2, A, Bad({2, 5}), B2, #{}) end},
         {<<"opts: expected only the options d, z, dt_bias, dt_softplus, got h0">>,
          fun() -> fusex:selective_scan_step(State, X2, X2, A, B2, B2, #{h0 => State}) end}] ++
        [{<<"dt: expected a tensor on ", (atom_to_binary(element(1, device())))/binary,
            ":0 (where x is), got one on cpu">>,
          fun() -> Scan([X, fusex:copy(Dt, cpu), A, B, C, #{}]) end} || device() =/= cpu],
    _ = Opts,
    [{case Msg of {prefix, P} -> P; _ -> Msg end,
      fun() ->
              try F() of
                  R -> error({expected_badarg, Msg, got, R})
              catch
                  error:{badarg, Got} when is_tuple(Msg) ->
                      {prefix, P} = Msg,
                      ?assertEqual(P, binary:part(Got, 0, min(byte_size(P), byte_size(Got))));
                  error:{badarg, Got} ->
                      ?assertEqual(Msg, Got)
              end
      end} || {Msg, F} <- Cases].

%% ---- the saved states' shape, from shapes alone ----

saved_shape_test() ->
    Shape = fun fusex:selective_scan_saved_shape/3,
    %% up to dstate 32 a state every 16 steps: ceil(100 / 16) - 1 = 6
    ?assertEqual({2, 6, 64, 16}, Shape({2, 100, 64}, {2, 100, 16}, {f, 32})),
    ?assertEqual({2, 6, 64, 32}, Shape({2, 100, 64}, {2, 100, 32}, {bf, 16})),
    %% above: every 8 steps (12), but 16 where the backward is sliced
    %% (dstate a multiple of 16 but 64, channels per group a multiple of 32)
    ?assertEqual({2, 12, 64, 64}, Shape({2, 100, 64}, {2, 100, 64}, {f, 32})),
    ?assertEqual({2, 6, 64, 128}, Shape({2, 100, 64}, {2, 100, 128}, {f, 32})),
    ?assertEqual({2, 6, 64, 48}, Shape({2, 100, 64}, {2, 100, 2, 48}, {f, 16})),
    ?assertEqual({2, 12, 48, 128}, Shape({2, 100, 48}, {2, 100, 128}, {f, 32})),
    ?assertEqual({2, 12, 64, 128}, Shape({2, 100, 64}, {2, 100, 4, 128}, {f, 32})),
    ?assertEqual({2, 12, 64, 100}, Shape({2, 100, 64}, {2, 100, 100}, {f, 64})),
    %% a single chunk saves nothing; an empty sequence neither
    ?assertEqual({3, 0, 8, 16}, Shape({3, 16, 8}, {3, 16, 16}, {f, 32})),
    ?assertEqual({3, 0, 8, 16}, Shape({3, 0, 8}, {3, 0, 16}, {f, 32})),
    ?assertEqual({3, 1, 8, 16}, Shape({3, 17, 8}, {3, 17, 16}, {f, 32})).

save_every_test() ->
    Every = fun fusex:selective_scan_save_every/3,
    ?assertEqual(16, Every({2, 100, 64}, {2, 100, 16}, {f, 32})),
    ?assertEqual(8, Every({2, 100, 64}, {2, 100, 64}, {f, 32})),
    ?assertEqual(16, Every({2, 100, 64}, {2, 100, 128}, {bf, 16})),
    ?assertEqual(8, Every({2, 100, 48}, {2, 100, 128}, {f, 32})),
    %% consistent with the shape: NSaved = ceil(L / K) - 1
    [begin
         K = Every({1, L, 64}, {1, L, N}, {f, 32}),
         {1, S, 64, N} = fusex:selective_scan_saved_shape({1, L, 64}, {1, L, N}, {f, 32}),
         ?assertEqual(max((L + K - 1) div K - 1, 0), S)
     end || L <- [1, 7, 8, 9, 16, 17, 100], N <- [4, 16, 48, 64, 100, 256]],
    ?assertError({badarg, <<"type: expected a float type, got {u,8}">>},
                 Every({2, 100, 64}, {2, 100, 16}, {u, 8})).

saved_shape_bad_input_test() ->
    Shape = fun fusex:selective_scan_saved_shape/3,
    ?assertBadarg(<<"x: expected a shape of rank 3 [batch, seqlen, dim], got {2,100}">>,
                  Shape({2, 100}, {2, 100, 16}, {f, 32})),
    ?assertBadarg(<<"b: expected a shape {2,100,dstate} or {2,100,groups,dstate} ([batch, seqlen, "
                    "[groups,] dstate]), got {2,99,16}">>,
                  Shape({2, 100, 64}, {2, 99, 16}, {f, 32})),
    ?assertBadarg(<<"b: expected dstate >= 1 and a number of groups that divides dim 64, got {2,100,3,16}">>,
                  Shape({2, 100, 64}, {2, 100, 3, 16}, {f, 32})),
    ?assertBadarg(<<"type: expected a float type, got {s,32}">>,
                  Shape({2, 100, 64}, {2, 100, 16}, {s, 32})),
    ?assertError({badarg, _}, Shape(not_a_shape, {2, 100, 16}, {f, 32})).
