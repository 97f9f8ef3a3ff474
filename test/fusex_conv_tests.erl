%% EUnit: causal_conv1d, its backward and its step on the device under
%% test: the forward against a pure-Erlang reference (every option, widths
%% 1 to 16, channels 1 and 37, sequences of 1, 2 and width - 1), a sequence
%% split with the state carried and a chain of steps equal to one call,
%% gradients (central differences on cpu, the cpu backend on a GPU), the
%% gradient map's keys, empty sequences, contexts that outlive their
%% inputs, and every kind of bad input with its message.
-module(fusex_conv_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, values/1]).

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

%% Random values of a problem {B, L, D, W}, as lists.
problem({B, L, D, W}) ->
    #{x => fusex_test_util:normal(B * L * D), w => fusex_test_util:uniform(D * W, -1.0, 1.0),
      bias => fusex_test_util:uniform(D, -0.5, 0.5), initial_state => fusex_test_util:normal(B * D * (W - 1))}.

shapes({B, L, D, W}) -> #{x => {B, L, D}, w => {D, W}, bias => {D}, initial_state => {B, D, W - 1}}.

%% The problem's tensors of Type on Device and their values as the tensors
%% hold them (rounded to Type).
tensors(Type, Dims, P, Device) ->
    Shapes = shapes(Dims),
    Ts = maps:map(fun(K, V) -> fusex_test_util:tensor(Type, maps:get(K, Shapes), V, Device) end, P),
    {Ts, maps:map(fun(_, T) -> values(T) end, Ts)}.

%% ---- forward against the reference ----

forward_matches_reference_test_() ->
    Dims = [{2, 7, 5, 4}, {1, 1, 37, 4}, {2, 2, 1, 3}, {1, 3, 4, 4}, {2, 5, 3, 1}, {1, 9, 6, 7},
            {1, 20, 2, 16}],
    [{lists:flatten(io_lib:format("~p ~p ~p", [D, Type, Variant])), fun() -> forward_case(D, Type, Variant) end}
     || D <- Dims, Type <- types(), Variant <- [plain, bias_silu, state, all]].

forward_case(Dims, Type, Variant) ->
    {Ts, Held} = tensors(Type, Dims, problem(Dims), device()),
    #{x := X, w := W, bias := Bias, initial_state := Init} = Ts,
    {Opts, Keys, Act} = case Variant of
                            plain -> {#{}, [], none};
                            bias_silu -> {#{bias => Bias, activation => silu}, [bias], silu};
                            state -> {#{initial_state => Init, return_state => true}, [initial_state], none};
                            all -> {#{bias => Bias, activation => silu, initial_state => Init,
                                      return_state => true}, [bias, initial_state], silu}
                        end,
    {WantY, WantFinal} = fusex_test_util:conv_reference(Dims, maps:with([x, w | Keys], Held), Act),
    case fusex:causal_conv1d(X, W, Opts) of
        {Y, Final} ->
            ?assertEqual(maps:get(initial_state, shapes(Dims)), fusex:shape(Final)),
            ?assertEqual(Type, fusex:type(Final)),
            close(values(Final), WantFinal, tol(Type));
        Y ->
            ?assertNot(maps:is_key(return_state, Opts))
    end,
    ?assertEqual(fusex:shape(X), fusex:shape(Y)),
    ?assertEqual(Type, fusex:type(Y)),
    close(values(Y), WantY, tol(Type)).

%% Hand-computed: width 2, w = [0.5, 2] (the current input times 2), bias 1,
%% initial state [3]: y = 1 + 0.5 * 3 + 2 * 1, 1 + 0.5 * 1 + 2 * 4.
by_hand_test() ->
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 32}, Shape, Vs) end,
    {Y, Final} = fusex:causal_conv1d(T({1, 2, 1}, [1.0, 4.0]), T({1, 2}, [0.5, 2.0]),
                                     #{bias => T({1}, [1.0]), initial_state => T({1, 1, 1}, [3.0]),
                                       return_state => true}),
    ?assertEqual([4.5, 9.5], values(Y)),
    ?assertEqual([4.0], values(Final)).

%% ---- identities ----

%% Frames T of a [B, L, D] list as [B, D] lists.
frame(Vs, {B, L, D, _}, T) ->
    lists:append([lists:sublist(Vs, (Bi * L + T) * D + 1, D) || Bi <- lists:seq(0, B - 1)]).

%% Steps From .. From + Len - 1 of a [B, L, D] list, as a [B, Len, D] list.
part(Vs, {B, L, D, _}, From, Len) ->
    lists:append([lists:sublist(Vs, (Bi * L + From) * D + 1, Len * D) || Bi <- lists:seq(0, B - 1)]).

steps_are_one_call_test_() ->
    [{lists:flatten(io_lib:format("~p ~p", [D, Type])), fun() -> steps_case(D, Type) end}
     || D <- [{2, 9, 5, 4}, {3, 6, 8, 1}, {1, 5, 37, 3}, {2, 4, 4, 7}], Type <- types()].

steps_case({B, L, D, _} = Dims, Type) ->
    Device = device(),
    P = problem(Dims),
    {#{x := X, w := W, bias := Bias, initial_state := Init}, _} = tensors(Type, Dims, P, Device),
    Opts = #{bias => Bias, activation => silu},
    {Y, Final} = fusex:causal_conv1d(X, W, Opts#{initial_state => Init, return_state => true}),
    State = fusex:copy(Init, Device),
    Xs = values(X),
    Frames = [begin
                  Yt = fusex:causal_conv1d_step(State, fusex_test_util:tensor(Type, {B, D}, frame(Xs, Dims, T), Device),
                                                W, Opts),
                  ?assertEqual({B, D}, fusex:shape(Yt)),
                  ?assertEqual(Type, fusex:type(Yt)),
                  values(Yt)
              end || T <- lists:seq(0, L - 1)],
    Stepped = lists:append([lists:append([lists:sublist(F, Bi * D + 1, D) || F <- Frames])
                            || Bi <- lists:seq(0, B - 1)]),
    close(Stepped, values(Y), tol(Type)),
    %% the state after the last step is the forward's final state, exactly
    ?assertEqual(values(Final), values(State)).

split_with_carried_state_test_() ->
    [{lists:flatten(io_lib:format("~p ~p cut ~p", [D, Type, Cut])), fun() -> split_case(D, Type, Cut) end}
     || D <- [{2, 11, 5, 4}, {1, 8, 3, 7}], Type <- types(), Cut <- [1, 2, 5]].

split_case({B, L, D, W} = Dims, Type, Cut) ->
    Device = device(),
    P = problem(Dims),
    {#{x := X, w := Wt, bias := Bias, initial_state := Init}, #{x := Xs}} = tensors(Type, Dims, P, Device),
    Opts = #{bias => Bias, return_state => true},
    {Y, Final} = fusex:causal_conv1d(X, Wt, Opts#{initial_state => Init}),
    Tensor = fun(Len, Vs) -> fusex_test_util:tensor(Type, {B, Len, D}, Vs, Device) end,
    {Y1, F1} = fusex:causal_conv1d(Tensor(Cut, part(Xs, Dims, 0, Cut)), Wt, Opts#{initial_state => Init}),
    {Y2, F2} = fusex:causal_conv1d(Tensor(L - Cut, part(Xs, Dims, Cut, L - Cut)), Wt, Opts#{initial_state => F1}),
    ?assertEqual({B, D, W - 1}, fusex:shape(F1)),
    Joined = lists:append([lists:sublist(values(Y1), Bi * Cut * D + 1, Cut * D) ++
                               lists:sublist(values(Y2), Bi * (L - Cut) * D + 1, (L - Cut) * D)
                           || Bi <- lists:seq(0, B - 1)]),
    close(Joined, values(Y), tol(Type)),
    ?assertEqual(values(Final), values(F2)).

%% ---- results, empty sequences, contexts ----

results_test() ->
    Device = device(),
    Dims = {2, 3, 4, 4},
    {#{x := X, w := W}, _} = tensors({f, 32}, Dims, problem(Dims), Device),
    Y = fusex:causal_conv1d(X, W),
    ?assert(is_reference(Y)),
    ?assertEqual(values(Y), values(fusex:causal_conv1d(X, W, #{activation => none}))),
    {_, Ctx} = fusex:causal_conv1d(X, W, #{save_for_backward => true}),
    ?assert(is_reference(Ctx)),
    {_, F, Ctx2} = fusex:causal_conv1d(X, W, #{save_for_backward => true, return_state => true}),
    ?assertEqual({2, 4, 3}, fusex:shape(F)),
    ?assertEqual([w, x], lists:sort(maps:keys(fusex:causal_conv1d_backward(Y, Ctx2)))),
    ?assertEqual(Device, fusex:device(Y)).

%% No steps: the final state is the initial one, its gradient passes
%% straight back, dw and dbias are zero.
empty_sequence_test() ->
    Device = device(),
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 32}, Shape, Vs, Device) end,
    X = T({2, 0, 3}, []),
    Init = T({2, 3, 2}, [float(I) || I <- lists:seq(1, 12)]),
    {Y, F, Ctx} = fusex:causal_conv1d(X, T({3, 3}, lists:duplicate(9, 0.5)),
                                      #{bias => T({3}, [1.0, 2.0, 3.0]), initial_state => Init,
                                        return_state => true, save_for_backward => true}),
    ?assertEqual({2, 0, 3}, fusex:shape(Y)),
    ?assertEqual(values(Init), values(F)),
    DFinal = T({2, 3, 2}, [float(-I) || I <- lists:seq(1, 12)]),
    G = fusex:causal_conv1d_backward(Y, Ctx, #{dfinal_state => DFinal}),
    ?assertEqual(values(DFinal), values(maps:get(initial_state, G))),
    ?assertEqual(lists:duplicate(9, 0.0), values(maps:get(w, G))),
    ?assertEqual(lists:duplicate(3, 0.0), values(maps:get(bias, G))),
    ?assertEqual({2, 0, 3}, fusex:shape(maps:get(x, G))).

context_outlives_its_inputs_test() ->
    Device = device(),
    Dims = {2, 6, 3, 4},
    {#{x := X, w := W, bias := Bias, initial_state := Init}, _} = tensors({f, 32}, Dims, problem(Dims), Device),
    Dy = fusex_test_util:tensor({f, 32}, {2, 6, 3}, fusex_test_util:normal(36), Device),
    {Y, Ctx} = fusex:causal_conv1d(X, W, #{bias => Bias, initial_state => Init, save_for_backward => true}),
    First = maps:map(fun(_, T) -> values(T) end, fusex:causal_conv1d_backward(Dy, Ctx)),
    [ok = fusex:free(T) || T <- [Y, X, W, Bias, Init]],
    erlang:garbage_collect(),
    Again = maps:map(fun(_, T) -> values(T) end, fusex:causal_conv1d_backward(Dy, Ctx)),
    ?assertEqual(First, Again).

%% ---- gradients ----

gradient_keys_test_() ->
    [{lists:flatten(io_lib:format("bias=~p initial_state=~p", [WithBias, WithInit])),
      fun() -> keys_case(WithBias, WithInit) end} || WithBias <- [false, true], WithInit <- [false, true]].

keys_case(WithBias, WithInit) ->
    Dims = {2, 4, 3, 3},
    {Ts = #{x := X, w := W}, _} = tensors({f, 32}, Dims, problem(Dims), device()),
    Given = [x, w] ++ [bias || WithBias] ++ [initial_state || WithInit],
    Opts = maps:with(Given -- [x, w], Ts),
    {Y, Ctx} = fusex:causal_conv1d(X, W, Opts#{save_for_backward => true}),
    G = fusex:causal_conv1d_backward(Y, Ctx),
    ?assertEqual(lists:sort(Given), lists:sort(maps:keys(G))),
    [begin
         ?assertEqual(fusex:shape(maps:get(K, Ts)), fusex:shape(maps:get(K, G))),
         ?assertEqual(fusex:type(maps:get(K, Ts)), fusex:type(maps:get(K, G)))
     end || K <- Given].

%% The loss <Wy, Y> + <Ws, FinalState> and its gradients: on cpu against
%% central differences in f64, on a GPU against the cpu backend.
gradients_test_() ->
    [{lists:flatten(io_lib:format("~p ~p", [Dims, Act])), fun() -> gradient_case(Dims, Act) end}
     || Dims <- [{2, 5, 3, 3}, {1, 2, 2, 4}, {2, 3, 2, 1}], Act <- [none, silu]].

gradient_case({B, L, D, W} = Dims, Act) ->
    P = problem(Dims),
    Wy = fusex_test_util:normal(B * L * D),
    Ws = fusex_test_util:normal(B * D * (W - 1)),
    Keys = [x, w, bias, initial_state],
    Grads = fun(Device, Type) ->
                    {#{x := X, w := Wt} = Ts, _} = tensors(Type, Dims, P, Device),
                    Opts = (maps:with([bias, initial_state], Ts))#{activation => Act, return_state => true,
                                                                   save_for_backward => true},
                    {_, _, Ctx} = fusex:causal_conv1d(X, Wt, Opts),
                    G = fusex:causal_conv1d_backward(
                          fusex_test_util:tensor(Type, {B, L, D}, Wy, Device), Ctx,
                          #{dfinal_state => fusex_test_util:tensor(Type, {B, D, W - 1}, Ws, Device)}),
                    maps:map(fun(_, T) -> values(T) end, G)
            end,
    case device() of
        cpu ->
            Got = Grads(cpu, {f, 64}),
            ?assertEqual(lists:sort(Keys), lists:sort(maps:keys(Got))),
            Loss = fun(Q) ->
                           {#{x := X, w := Wt} = Ts, _} = tensors({f, 64}, Dims, Q, cpu),
                           {Y, F} = fusex:causal_conv1d(X, Wt, (maps:with([bias, initial_state], Ts))#{
                                                                   activation => Act, return_state => true}),
                           fusex_test_util:dot(values(Y), Wy) + fusex_test_util:dot(values(F), Ws)
                   end,
            [close(maps:get(K, Got),
                   fusex_test_util:central_differences(fun(V) -> Loss(P#{K := V}) end, maps:get(K, P)), 1.0e-6)
             || K <- Keys, maps:get(K, P) =/= []];
        Gpu ->
            Got = Grads(Gpu, {f, 32}),
            Want = Grads(cpu, {f, 32}),
            [close(maps:get(K, Got), maps:get(K, Want), 1.0e-5) || K <- Keys]
    end.

%% ---- bad input ----

bad_input_test_() ->
    Device = device(),
    T = fun(Type, Shape) ->
                N = lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)),
                fusex_test_util:tensor(Type, Shape, [0.5 || _ <- lists:seq(1, N)], Device)
        end,
    X = T({f, 32}, {2, 3, 4}),
    W = T({f, 32}, {4, 3}),
    Bias = T({f, 32}, {4}),
    Init = T({f, 32}, {2, 4, 2}),
    Frame = T({f, 32}, {2, 4}),
    Ints = fusex_test_util:tensor({s, 32}, {2, 3, 4}, lists:duplicate(24, 1), Device),
    Half = T({f, 16}, {2, 4, 2}),
    Freed = T({f, 32}, {2, 3, 4}),
    ok = fusex:free(Freed),
    {Y, Ctx} = fusex:causal_conv1d(X, W, #{save_for_backward => true}),
    {_, ScanCtx} = fusex:linear_scan(X, X, #{save_for_backward => true}),
    Cases =
        [{<<"x: expected a fusex tensor, got foo">>, fun() -> fusex:causal_conv1d(foo, W) end},
         {<<"w: expected a fusex tensor, got 1">>, fun() -> fusex:causal_conv1d(X, 1) end},
         {<<"x: expected a live tensor, got one released by fusex:free/1">>,
          fun() -> fusex:causal_conv1d(Freed, W) end},
         {float_msg(Device), fun() -> fusex:causal_conv1d(Ints, W) end},
         {<<"x: expected rank 3 [batch, seqlen, dim], got rank 2 shape {2,4}">>,
          fun() -> fusex:causal_conv1d(Frame, W) end},
         {<<"w: expected shape {4,3} [dim, width], got {5,3}">>,
          fun() -> fusex:causal_conv1d(X, T({f, 32}, {5, 3})) end},
         {<<"w: expected rank 2 [dim, width], got rank 1 shape {4}">>, fun() -> fusex:causal_conv1d(X, Bias) end},
         {<<"w: expected a width of 1 to 16 [dim, width], got shape {4,17}">>,
          fun() -> fusex:causal_conv1d(X, T({f, 32}, {4, 17})) end},
         {<<"w: expected a width of 1 to 16 [dim, width], got shape {4,0}">>,
          fun() -> fusex:causal_conv1d(X, T({f, 32}, {4, 0})) end},
         {<<"bias: expected shape {4} [dim], got {3}">>,
          fun() -> fusex:causal_conv1d(X, W, #{bias => T({f, 32}, {3})}) end},
         {<<"initial_state: expected shape {2,4,2} [batch, dim, width - 1], got {2,4,3}">>,
          fun() -> fusex:causal_conv1d(X, W, #{initial_state => T({f, 32}, {2, 4, 3})}) end},
         {<<"initial_state: expected type {f,32}, got {f,16}">>,
          fun() -> fusex:causal_conv1d(X, W, #{initial_state => Half}) end},
         {<<"initial_state: expected a fusex tensor, got zeros">>,
          fun() -> fusex:causal_conv1d(X, W, #{initial_state => zeros}) end},
         {<<"activation: expected none or silu, got relu">>,
          fun() -> fusex:causal_conv1d(X, W, #{activation => relu}) end},
         {<<"activation: expected none or silu, got <<\"silu\">>">>,
          fun() -> fusex:causal_conv1d(X, W, #{activation => <<"silu">>}) end},
         {<<"return_state: expected true or false, got 1">>,
          fun() -> fusex:causal_conv1d(X, W, #{return_state => 1}) end},
         {<<"opts: expected a map, got [bias]">>, fun() -> fusex:causal_conv1d(X, W, [bias]) end},
         {<<"opts: expected only the options bias, activation, initial_state, return_state, save_for_backward, "
            "got h0">>, fun() -> fusex:causal_conv1d(X, W, #{h0 => Init}) end},
         {<<"dy: expected shape {2,3,4} [batch, seqlen, dim], got {2,4}">>,
          fun() -> fusex:causal_conv1d_backward(Frame, Ctx) end},
         {<<"dy: expected type {f,32}, got {f,16}">>,
          fun() -> fusex:causal_conv1d_backward(T({f, 16}, {2, 3, 4}), Ctx) end},
         {<<"dfinal_state: expected shape {2,4,2} [batch, dim, width - 1], got {2,4}">>,
          fun() -> fusex:causal_conv1d_backward(Y, Ctx, #{dfinal_state => Frame}) end},
         {<<"opts: expected only the options dfinal_state, got initial_state">>,
          fun() -> fusex:causal_conv1d_backward(Y, Ctx, #{initial_state => Init}) end},
         {{prefix, <<"ctx: expected a context saved by fusex:causal_conv1d, got #Ref<">>},
          fun() -> fusex:causal_conv1d_backward(Y, ScanCtx) end},
         {<<"dy: expected a fusex tensor, got nil">>, fun() -> fusex:causal_conv1d_backward(nil, Ctx) end},
         {<<"state: expected shape {2,4,2} [batch, dim, width - 1], got {2,4}">>,
          fun() -> fusex:causal_conv1d_step(Frame, Frame, W) end},
         {<<"x: expected rank 2 [batch, dim], got rank 3 shape {2,3,4}">>,
          fun() -> fusex:causal_conv1d_step(Init, X, W) end},
         {<<"state: expected type {f,32}, got {f,16}">>, fun() -> fusex:causal_conv1d_step(Half, Frame, W) end},
         {<<"opts: expected only the options bias, activation, got initial_state">>,
          fun() -> fusex:causal_conv1d_step(Init, Frame, W, #{initial_state => Init}) end},
         {<<"state: expected a fusex tensor, got undefined">>,
          fun() -> fusex:causal_conv1d_step(undefined, Frame, W) end}]
        ++ gpu_only_cases(Device, X, W),
    [{lists:flatten(io_lib:format("~p", [Expected])),
      fun() -> fusex_test_util:check_badarg(Expected, F) end} || {Expected, F} <- Cases].

float_msg(cpu) -> <<"x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}">>;
float_msg(_) -> <<"x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}">>.

gpu_only_cases(cpu, _, _) -> [];
gpu_only_cases(_Gpu, X, W) ->
    OnCpu = fusex:copy(W, cpu),
    F64 = fusex:copy(fusex:convert(fusex:copy(X, cpu), {f, 64}), device()),
    [{<<"w: expected a tensor on cuda:0 (where x is), got one on cpu">>, fun() -> fusex:causal_conv1d(X, OnCpu) end},
     {<<"x: expected type {f,32}, {bf,16} or {f,16} on cuda:0 ({f,64} runs on cpu only), got {f,64}">>,
      fun() -> fusex:causal_conv1d(F64, W) end}].
