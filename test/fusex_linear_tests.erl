%% EUnit: the linear layer and its backward on the device under test: the
%% forward against a pure-Erlang reference (every activation, with and
%% without a bias, x of rank 1 to 3, K 1 and 1000, a frame of one row),
%% exact f32 by default and TF32 on request, gradients (central differences
%% on cpu, the cpu backend on a GPU), the gradient map's keys, empty
%% inputs, contexts that outlive their inputs, and every kind of bad input
%% with its message.
-module(fusex_linear_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, values/1]).

-define(ACTS, [none, relu, gelu, silu, tanh, sigmoid]).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

types() ->
    case device() of
        cpu -> [{f, 32}, {f, 64}, {bf, 16}];
        _ -> [{f, 32}, {bf, 16}, {f, 16}]
    end.

tol({f, 64}) -> 1.0e-12;
tol({f, 32}) -> 1.0e-5;
tol(_) -> 1.0e-2.

close(Got, Want, Tol) -> fusex_test_util:assert_close(Got, Want, Tol).

numel(Shape) -> lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)).

%% x of XShape ([..., in]) and w [out, in], bias [out]: values as lists.
problem(XShape, Out) ->
    In = element(tuple_size(XShape), XShape),
    Scale = 1 / math:sqrt(max(In, 1)),
    #{x => fusex_test_util:normal(numel(XShape)), w => [Scale * V || V <- fusex_test_util:normal(Out * In)],
      bias => fusex_test_util:uniform(Out, -0.5, 0.5)}.

tensors(Type, XShape, Out, P, Device) ->
    In = element(tuple_size(XShape), XShape),
    Shapes = #{x => XShape, w => {Out, In}, bias => {Out}},
    Ts = maps:map(fun(K, V) -> fusex_test_util:tensor(Type, maps:get(K, Shapes), V, Device) end, P),
    {Ts, maps:map(fun(_, T) -> values(T) end, Ts)}.

out_shape(XShape, Out) -> setelement(tuple_size(XShape), XShape, Out).

%% ---- forward against the reference ----

forward_matches_reference_test_() ->
    Cases = [{{5, 7}, 6}, {{2, 3, 8}, 4}, {{9}, 3}, {{1, 256}, 1024}, {{4, 1}, 5}, {{2, 1000}, 3}],
    [{lists:flatten(io_lib:format("~p -> ~p ~p ~p bias=~p", [XS, Out, Type, Act, WithBias])),
      fun() -> forward_case(XS, Out, Type, Act, WithBias) end}
     || {XS, Out} <- Cases, Type <- types(), Act <- ?ACTS, WithBias <- [true, false],
        WithBias orelse Act =:= none orelse Act =:= silu].

forward_case(XShape, Out, Type, Act, WithBias) ->
    {#{x := X, w := W, bias := B}, Held} = tensors(Type, XShape, Out, problem(XShape, Out), device()),
    Opts = case WithBias of true -> #{bias => B, activation => Act}; false -> #{activation => Act} end,
    Y = fusex:linear(X, W, Opts),
    Rows = numel(XShape) div element(tuple_size(XShape), XShape),
    In = element(tuple_size(XShape), XShape),
    Want = fusex_test_util:linear_reference({Rows, In, Out}, maps:with([x, w | [bias || WithBias]], Held), Act),
    ?assertEqual(out_shape(XShape, Out), fusex:shape(Y)),
    ?assertEqual(Type, fusex:type(Y)),
    close(values(Y), Want, tol(Type)).

%% f32 is exact f32 unless allow_tf32: on a GPU TF32 products are within
%% TF32's precision (10 bits of mantissa) and the default is exact.
tf32_test() ->
    XShape = {64, 96},
    {#{x := X, w := W}, Held} = tensors({f, 32}, XShape, 32, problem(XShape, 32), device()),
    Want = fusex_test_util:linear_reference({64, 96, 32}, maps:with([x, w], Held), none),
    close(values(fusex:linear(X, W)), Want, 1.0e-5),
    close(values(fusex:linear(X, W, #{allow_tf32 => true})), Want, 5.0e-3).

%% Hand-computed: x [1, 2] . w rows [3, 4] and [-1, 1], bias [0.5, 0]:
%% pre = [11.5, 1]; relu keeps both, y = act(pre).
by_hand_test() ->
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 32}, Shape, Vs) end,
    X = T({1, 2}, [1.0, 2.0]),
    W = T({2, 2}, [3.0, 4.0, -1.0, 1.0]),
    ?assertEqual([11.5, 1.0], values(fusex:linear(X, W, #{bias => T({2}, [0.5, 0.0]), activation => relu}))),
    ?assertEqual([0.0, 0.0], values(fusex:linear(X, W, #{bias => T({2}, [-20.0, -1.0]), activation => relu}))).

%% ---- results, empty inputs, contexts ----

results_test() ->
    Device = device(),
    {#{x := X, w := W, bias := B}, _} = tensors({bf, 16}, {3, 8}, 5, problem({3, 8}, 5), Device),
    Y = fusex:linear(X, W),
    ?assert(is_reference(Y)),
    ?assertEqual({3, 5}, fusex:shape(Y)),
    {Y1, Ctx} = fusex:linear(X, W, #{bias => B, activation => gelu, save_for_backward => true}),
    ?assert(is_reference(Ctx)),
    ?assertEqual([bias, w, x], lists:sort(maps:keys(fusex:linear_backward(Y1, Ctx)))),
    ?assertEqual(Device, fusex:device(Y)).

%% No rows: y is empty and every gradient zero; no outputs (out 0) likewise.
empty_test() ->
    Device = device(),
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 32}, Shape, Vs, Device) end,
    {Y, Ctx} = fusex:linear(T({0, 3}, []), T({2, 3}, lists:duplicate(6, 1.0)),
                            #{bias => T({2}, [1.0, 1.0]), activation => silu, save_for_backward => true}),
    ?assertEqual({0, 2}, fusex:shape(Y)),
    G = fusex:linear_backward(Y, Ctx),
    ?assertEqual(lists:duplicate(6, 0.0), values(maps:get(w, G))),
    ?assertEqual([0.0, 0.0], values(maps:get(bias, G))),
    {Y2, Ctx2} = fusex:linear(T({2, 3}, lists:duplicate(6, 1.0)), T({0, 3}, []), #{save_for_backward => true}),
    ?assertEqual({2, 0}, fusex:shape(Y2)),
    ?assertEqual(lists:duplicate(6, 0.0), values(maps:get(x, fusex:linear_backward(Y2, Ctx2)))).

context_outlives_its_inputs_test_() ->
    [{atom_to_list(Act), fun() -> outlives_case(Act) end} || Act <- [none, tanh, silu]].

outlives_case(Act) ->
    Device = device(),
    {#{x := X, w := W, bias := B}, _} = tensors({f, 32}, {4, 6}, 3, problem({4, 6}, 3), Device),
    Dy = fusex_test_util:tensor({f, 32}, {4, 3}, fusex_test_util:normal(12), Device),
    {Y, Ctx} = fusex:linear(X, W, #{bias => B, activation => Act, save_for_backward => true}),
    First = maps:map(fun(_, T) -> values(T) end, fusex:linear_backward(Dy, Ctx)),
    [ok = fusex:free(T) || T <- [Y, X, W, B]],
    erlang:garbage_collect(),
    Again = maps:map(fun(_, T) -> values(T) end, fusex:linear_backward(Dy, Ctx)),
    ?assertEqual(First, Again).

%% ---- gradients ----

gradient_keys_test_() ->
    [{lists:flatten(io_lib:format("bias=~p", [WithBias])), fun() -> keys_case(WithBias) end}
     || WithBias <- [false, true]].

keys_case(WithBias) ->
    {Ts = #{x := X, w := W}, _} = tensors({f, 32}, {2, 3, 4}, 5, problem({2, 3, 4}, 5), device()),
    Given = [x, w] ++ [bias || WithBias],
    {Y, Ctx} = fusex:linear(X, W, (maps:with(Given -- [x, w], Ts))#{save_for_backward => true}),
    G = fusex:linear_backward(Y, Ctx),
    ?assertEqual(lists:sort(Given), lists:sort(maps:keys(G))),
    [begin
         ?assertEqual(fusex:shape(maps:get(K, Ts)), fusex:shape(maps:get(K, G))),
         ?assertEqual(fusex:type(maps:get(K, Ts)), fusex:type(maps:get(K, G)))
     end || K <- Given].

%% The loss <Wy, Y> and its gradients for every activation: on cpu against
%% central differences in f64, on a GPU against the cpu backend (exact
%% f32 products on both).
gradients_test_() ->
    [{lists:flatten(io_lib:format("~p -> ~p ~p", [XS, Out, Act])), fun() -> gradient_case(XS, Out, Act) end}
     || {XS, Out} <- [{{3, 4}, 5}, {{2, 1, 3}, 2}, {{2, 1}, 3}], Act <- ?ACTS].

gradient_case(XShape, Out, Act) ->
    P = problem(XShape, Out),
    Wy = fusex_test_util:normal(numel(out_shape(XShape, Out))),
    Grads = fun(Device, Type) ->
                    {#{x := X, w := W, bias := B}, _} = tensors(Type, XShape, Out, P, Device),
                    {_, Ctx} = fusex:linear(X, W, #{bias => B, activation => Act, save_for_backward => true}),
                    G = fusex:linear_backward(fusex_test_util:tensor(Type, out_shape(XShape, Out), Wy, Device), Ctx),
                    maps:map(fun(_, T) -> values(T) end, G)
            end,
    case device() of
        cpu ->
            Got = Grads(cpu, {f, 64}),
            Loss = fun(Q) ->
                           {#{x := X, w := W, bias := B}, _} = tensors({f, 64}, XShape, Out, Q, cpu),
                           fusex_test_util:dot(values(fusex:linear(X, W, #{bias => B, activation => Act})), Wy)
                   end,
            ?assertEqual([bias, w, x], lists:sort(maps:keys(Got))),
            [close(maps:get(K, Got),
                   fusex_test_util:central_differences(fun(V) -> Loss(P#{K := V}) end, maps:get(K, P)), 1.0e-6)
             || K <- [x, w, bias]];
        Gpu ->
            Got = Grads(Gpu, {f, 32}),
            Want = Grads(cpu, {f, 32}),
            [close(maps:get(K, Got), maps:get(K, Want), 1.0e-5) || K <- [x, w, bias]]
    end.

%% ---- bad input ----

bad_input_test_() ->
    Device = device(),
    T = fun(Type, Shape) -> fusex_test_util:tensor(Type, Shape, lists:duplicate(numel(Shape), 0.5), Device) end,
    X = T({f, 32}, {2, 4}),
    W = T({f, 32}, {3, 4}),
    B = T({f, 32}, {3}),
    Ints = fusex_test_util:tensor({s, 32}, {2, 4}, lists:duplicate(8, 1), Device),
    {Y, Ctx} = fusex:linear(X, W, #{save_for_backward => true}),
    {_, ConvCtx} = fusex:causal_conv1d(T({f, 32}, {1, 2, 3}), W, #{save_for_backward => true}),
    Cases =
        [{<<"x: expected a fusex tensor, got foo">>, fun() -> fusex:linear(foo, W) end},
         {float_msg(Device), fun() -> fusex:linear(Ints, W) end},
         {<<"x: expected rank >= 1 [..., in], got rank 0 shape {}">>, fun() -> fusex:linear(T({f, 32}, {}), W) end},
         {<<"w: expected shape {3,4} [out, in], got {3,5}">>, fun() -> fusex:linear(X, T({f, 32}, {3, 5})) end},
         {<<"w: expected rank 2 [out, in], got rank 1 shape {3}">>, fun() -> fusex:linear(X, B) end},
         {<<"w: expected type {f,32}, got {f,16}">>, fun() -> fusex:linear(X, T({f, 16}, {3, 4})) end},
         {<<"bias: expected shape {3} [out], got {4}">>, fun() -> fusex:linear(X, W, #{bias => T({f, 32}, {4})}) end},
         {<<"activation: expected none, relu, gelu, silu, tanh or sigmoid, got softmax">>,
          fun() -> fusex:linear(X, W, #{activation => softmax}) end},
         {<<"activation: expected none, relu, gelu, silu, tanh or sigmoid, got 3">>,
          fun() -> fusex:linear(X, W, #{activation => 3}) end},
         {<<"allow_tf32: expected true or false, got yes">>, fun() -> fusex:linear(X, W, #{allow_tf32 => yes}) end},
         {<<"opts: expected only the options bias, activation, allow_tf32, save_for_backward, got eps">>,
          fun() -> fusex:linear(X, W, #{eps => 1.0e-5}) end},
         {<<"dy: expected shape {2,3} [..., out], got {2,4}">>, fun() -> fusex:linear_backward(X, Ctx) end},
         {<<"dy: expected type {f,32}, got {f,16}">>, fun() -> fusex:linear_backward(T({f, 16}, {2, 3}), Ctx) end},
         {<<"opts: expected no options, got bias">>, fun() -> fusex:linear_backward(Y, Ctx, #{bias => B}) end},
         {{prefix, <<"ctx: expected a context saved by fusex:linear, got #Ref<">>},
          fun() -> fusex:linear_backward(Y, ConvCtx) end}]
        ++ gpu_only_cases(Device, X, W),
    [{lists:flatten(io_lib:format("~p", [Expected])),
      fun() -> fusex_test_util:check_badarg(Expected, F) end} || {Expected, F} <- Cases].

float_msg(cpu) -> <<"x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}">>;
float_msg(_) -> <<"x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}">>.

gpu_only_cases(cpu, _, _) -> [];
gpu_only_cases(_Gpu, X, W) ->
    [{<<"w: expected a tensor on cuda:0 (where x is), got one on cpu">>,
      fun() -> fusex:linear(X, fusex:copy(W, cpu)) end}].
