%% EUnit: rms_norm and layer_norm, their backward, on the device under
%% test: the forward against a pure-Erlang reference (bias, residual and s
%% in its type or f32, gate, eps; ranks 1 to 3, rows of 1 and 65,537
%% elements, hidden 1), gradients (central differences on cpu, the cpu
%% backend on a GPU) with and without ds, the gradient map's keys, empty
%% inputs, contexts that outlive their inputs, and every kind of bad input
%% with its message.
-module(fusex_norm_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, values/1]).

-define(KINDS, [rms_norm, layer_norm]).

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
hidden(Shape) -> element(tuple_size(Shape), Shape).
rows(Shape) -> numel(Shape) div max(hidden(Shape), 1).

%% Random values for x of Shape, as lists.
problem(Shape) ->
    N = numel(Shape), H = hidden(Shape),
    #{x => fusex_test_util:normal(N), weight => fusex_test_util:uniform(H, 0.5, 1.5),
      bias => fusex_test_util:uniform(H, -0.5, 0.5), residual => fusex_test_util:normal(N),
      gate => fusex_test_util:normal(N)}.

%% Tensors of Type (the residual of ResType) on Device and their values as
%% the tensors hold them.
tensors(Type, ResType, Shape, P, Device) ->
    Ts = maps:map(fun(residual, V) -> fusex_test_util:tensor(ResType, Shape, V, Device);
                     (K, V) when K =:= weight; K =:= bias -> fusex_test_util:tensor(Type, {hidden(Shape)}, V, Device);
                     (_, V) -> fusex_test_util:tensor(Type, Shape, V, Device)
                  end, P),
    {Ts, maps:map(fun(_, T) -> values(T) end, Ts)}.

%% The call: rms_norm(X, Weight, Opts) or layer_norm(X, Weight, Bias, Opts)
%% (bias from the tensors, taken out of Opts).
call(rms_norm, Ts, Opts) -> fusex:rms_norm(maps:get(x, Ts), maps:get(weight, Ts), Opts);
call(layer_norm, Ts, Opts) ->
    fusex:layer_norm(maps:get(x, Ts), maps:get(weight, Ts), maps:get(bias, Ts), maps:remove(bias, Opts)).

backward(rms_norm, Dy, Ctx, Opts) -> fusex:rms_norm_backward(Dy, Ctx, Opts);
backward(layer_norm, Dy, Ctx, Opts) -> fusex:layer_norm_backward(Dy, Ctx, Opts).

%% The options a variant gives (tensors from Ts) and the inputs it passes.
variant(Kind, Variant, Ts) ->
    Given = case Variant of
                plain -> [];
                bias -> [bias];
                residual -> [residual];
                residual_f32 -> [residual];
                gate -> [gate];
                all -> [bias, residual, gate]
            end ++ [bias || Kind =:= layer_norm],
    Opts0 = maps:with(Given, Ts),
    Opts = case Variant of
               residual_f32 -> Opts0#{residual_in_f32 => true};
               all -> Opts0#{eps => 1.0e-3};
               _ -> Opts0
           end,
    {Opts, lists:usort(Given)}.

%% ---- forward against the reference ----

forward_matches_reference_test_() ->
    Shapes = [{3, 4, 8}, {5, 16}, {8}, {1, 1}, {2, 37}, {4, 1, 3}],
    [{lists:flatten(io_lib:format("~p ~p ~p ~p", [Kind, S, Type, V])), fun() -> forward_case(Kind, S, Type, V) end}
     || Kind <- ?KINDS, S <- Shapes, Type <- types(), V <- [plain, bias, residual, residual_f32, gate, all]].

%% A row of 65,537 elements (the kernels' long-row path), with a residual.
long_row_test_() ->
    [{atom_to_list(Kind), {timeout, 60, fun() -> forward_case(Kind, {65537}, {f, 32}, residual) end}}
     || Kind <- ?KINDS].

forward_case(Kind, Shape, Type, Variant) ->
    ResType = case Variant of residual_f32 -> {f, 32}; _ -> Type end,
    {Ts, Held} = tensors(Type, ResType, Shape, problem(Shape), device()),
    {Opts, Given} = variant(Kind, Variant, Ts),
    Eps = maps:get(eps, Opts, 1.0e-5),
    {WantY, WantS} = fusex_test_util:norm_reference(Kind, {rows(Shape), hidden(Shape)},
                                                    maps:with([x, weight | Given], Held), Eps),
    Y = case call(Kind, Ts, Opts) of
            {Y0, S} ->
                SType = case maps:get(residual_in_f32, Opts, false) of true -> {f, 32}; false -> ResType end,
                ?assertEqual(SType, fusex:type(S)),
                ?assertEqual(Shape, fusex:shape(S)),
                close(values(S), WantS, tol(SType)),
                Y0;
            Y0 ->
                ?assertEqual(none, WantS),
                Y0
        end,
    ?assertEqual(Shape, fusex:shape(Y)),
    ?assertEqual(Type, fusex:type(Y)),
    close(values(Y), WantY, tol(Type)).

%% Hand-computed: rms of [3, 4] is sqrt(12.5); with weight [1, 2] and the
%% residual [0, 0], y = [3, 8] / sqrt(12.5) and s = x.
by_hand_test() ->
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 64}, Shape, Vs, cpu) end,
    {Y, S} = fusex:rms_norm(T({1, 2}, [3.0, 4.0]), T({2}, [1.0, 2.0]), #{residual => T({1, 2}, [0.0, 0.0]), eps => 0}),
    close(values(Y), [3 / math:sqrt(12.5), 8 / math:sqrt(12.5)], 1.0e-15),
    ?assertEqual([3.0, 4.0], values(S)),
    %% layer_norm of [1, 3]: mean 2, var 1; weight 1, bias 10
    Z = fusex:layer_norm(T({2}, [1.0, 3.0]), T({2}, [1.0, 1.0]), T({2}, [10.0, 10.0]), #{eps => 0.0}),
    ?assertEqual([9.0, 11.0], values(Z)).

%% ---- results, empty inputs, contexts ----

results_test() ->
    Device = device(),
    Shape = {2, 3, 8},
    {Ts, _} = tensors({bf, 16}, {f, 32}, Shape, problem(Shape), Device),
    Y = call(rms_norm, Ts, #{}),
    ?assert(is_reference(Y)),
    {Y1, S1} = call(rms_norm, Ts, #{residual => maps:get(residual, Ts)}),
    ?assertEqual({f, 32}, fusex:type(S1)), % the residual's type
    {_, Ctx} = call(rms_norm, Ts, #{save_for_backward => true}),
    ?assert(is_reference(Ctx)),
    {_, _, Ctx2} = call(layer_norm, Ts, #{residual => maps:get(residual, Ts), save_for_backward => true}),
    ?assertEqual([bias, residual, weight, x], lists:sort(maps:keys(fusex:layer_norm_backward(Y1, Ctx2)))),
    ?assertEqual(values(Y), values(fusex:rms_norm(maps:get(x, Ts), maps:get(weight, Ts)))),
    ?assertEqual(Device, fusex:device(Y)).

empty_rows_test() ->
    Device = device(),
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 32}, Shape, Vs, Device) end,
    X = T({0, 4}, []),
    {Y, S, Ctx} = fusex:layer_norm(X, T({4}, [1.0, 2.0, 3.0, 4.0]), T({4}, [0.5, 0.5, 0.5, 0.5]),
                                   #{residual => X, save_for_backward => true}),
    ?assertEqual({0, 4}, fusex:shape(Y)),
    ?assertEqual({0, 4}, fusex:shape(S)),
    G = fusex:layer_norm_backward(Y, Ctx, #{ds => S}),
    ?assertEqual(lists:duplicate(4, 0.0), values(maps:get(weight, G))),
    ?assertEqual(lists:duplicate(4, 0.0), values(maps:get(bias, G))),
    ?assertEqual({0, 4}, fusex:shape(maps:get(residual, G))).

context_outlives_its_inputs_test() ->
    Device = device(),
    Shape = {3, 5},
    {Ts, _} = tensors({f, 32}, {f, 32}, Shape, problem(Shape), Device),
    Dy = fusex_test_util:tensor({f, 32}, Shape, fusex_test_util:normal(15), Device),
    {Y, S, Ctx} = call(rms_norm, Ts, (maps:with([bias, residual, gate], Ts))#{save_for_backward => true}),
    First = maps:map(fun(_, T) -> values(T) end, fusex:rms_norm_backward(Dy, Ctx, #{ds => Dy})),
    [ok = fusex:free(T) || T <- [Y, S | maps:values(Ts)]],
    erlang:garbage_collect(),
    Again = maps:map(fun(_, T) -> values(T) end, fusex:rms_norm_backward(Dy, Ctx, #{ds => Dy})),
    ?assertEqual(First, Again).

%% ---- gradients ----

gradient_keys_test_() ->
    [{lists:flatten(io_lib:format("~p ~p", [Kind, V])), fun() -> keys_case(Kind, V) end}
     || Kind <- ?KINDS, V <- [plain, bias, residual, gate, all]].

keys_case(Kind, Variant) ->
    Shape = {2, 6},
    {Ts, _} = tensors({f, 32}, {f, 32}, Shape, problem(Shape), device()),
    {Opts, Given} = variant(Kind, Variant, Ts),
    Out = call(Kind, Ts, Opts#{save_for_backward => true}),
    G = backward(Kind, element(1, Out), element(tuple_size(Out), Out), #{}),
    Want = lists:sort([x, weight | Given]),
    ?assertEqual(Want, lists:sort(maps:keys(G))),
    [begin
         ?assertEqual(fusex:shape(maps:get(K, Ts)), fusex:shape(maps:get(K, G))),
         ?assertEqual(fusex:type(maps:get(K, Ts)), fusex:type(maps:get(K, G)))
     end || K <- Want].

%% The loss <Wy, Y> (+ <Ws, S>) and its gradients: on cpu against central
%% differences in f64, on a GPU against the cpu backend. eps 0.01: a row
%% of one element near 0 curves on the scale of sqrt(eps), which central
%% differences of step 1e-5 must resolve.
gradients_test_() ->
    [{lists:flatten(io_lib:format("~p ~p ~p ds=~p", [Kind, S, V, Ds])), fun() -> gradient_case(Kind, S, V, Ds) end}
     || Kind <- ?KINDS, S <- [{3, 4}, {2, 1, 5}, {2, 1}], V <- [plain, all], Ds <- [false, true],
        Ds =:= false orelse V =:= all].

gradient_case(Kind, Shape, Variant, UseDs) ->
    P = problem(Shape),
    N = numel(Shape),
    Wy = fusex_test_util:normal(N),
    Ws = fusex_test_util:normal(N),
    Keys = fun(Ts) -> [x, weight | element(2, variant(Kind, Variant, Ts))] end,
    Grads = fun(Device, Type) ->
                    {Ts, _} = tensors(Type, Type, Shape, P, Device),
                    {Opts, _} = variant(Kind, Variant, Ts),
                    Out = call(Kind, Ts, Opts#{save_for_backward => true, eps => 0.01}),
                    BOpts = case UseDs of
                                true -> #{ds => fusex_test_util:tensor(Type, Shape, Ws, Device)};
                                false -> #{}
                            end,
                    G = backward(Kind, fusex_test_util:tensor(Type, Shape, Wy, Device), element(tuple_size(Out), Out),
                                 BOpts),
                    maps:map(fun(_, T) -> values(T) end, G)
            end,
    case device() of
        cpu ->
            Got = Grads(cpu, {f, 64}),
            Loss = fun(Q) ->
                           {Ts, _} = tensors({f, 64}, {f, 64}, Shape, Q, cpu),
                           {Opts, _} = variant(Kind, Variant, Ts),
                           case call(Kind, Ts, Opts#{eps => 0.01}) of
                               {Y, S} when UseDs -> fusex_test_util:dot(values(Y), Wy) + fusex_test_util:dot(values(S), Ws);
                               {Y, _} -> fusex_test_util:dot(values(Y), Wy);
                               Y -> fusex_test_util:dot(values(Y), Wy)
                           end
                   end,
            Want = lists:usort(Keys(P)),
            ?assertEqual(Want, lists:sort(maps:keys(Got))),
            [close(maps:get(K, Got),
                   fusex_test_util:central_differences(fun(V) -> Loss(P#{K := V}) end, maps:get(K, P)), 1.0e-6)
             || K <- Want];
        Gpu ->
            Got = Grads(Gpu, {f, 32}),
            Want = Grads(cpu, {f, 32}),
            %% a row of one element: dx is rstd * dn * (1 - n^2) with n^2
            %% near 1, which f32 arithmetic resolves to a few digits only
            Tol = case hidden(Shape) of 1 -> 1.0e-3; _ -> 1.0e-5 end,
            [close(maps:get(K, Got), maps:get(K, Want), Tol) || K <- maps:keys(Want)]
    end.

%% ---- bad input ----

bad_input_test_() ->
    Device = device(),
    T = fun(Type, Shape) -> fusex_test_util:tensor(Type, Shape, lists:duplicate(numel(Shape), 0.5), Device) end,
    X = T({f, 32}, {2, 8}),
    W = T({f, 32}, {8}),
    W7 = T({f, 32}, {7}),
    X7 = T({f, 32}, {2, 7}),
    Half = T({f, 16}, {2, 8}),
    Bf = T({bf, 16}, {2, 8}),
    Ints = fusex_test_util:tensor({s, 32}, {2, 8}, lists:duplicate(16, 1), Device),
    {Y, Ctx} = fusex:rms_norm(X, W, #{save_for_backward => true}),
    {_, _, ResCtx} = fusex:layer_norm(X, W, W, #{residual => X, save_for_backward => true}),
    Cases =
        [{<<"x: expected a fusex tensor, got foo">>, fun() -> fusex:rms_norm(foo, W) end},
         {float_msg(Device), fun() -> fusex:rms_norm(Ints, W) end},
         {<<"x: expected rank >= 1 [..., hidden], got rank 0 shape {}">>,
          fun() -> fusex:rms_norm(T({f, 32}, {}), W) end},
         {<<"x: expected hidden >= 1 [..., hidden], got shape {2,0}">>,
          fun() -> fusex:rms_norm(T({f, 32}, {2, 0}), W) end},
         {<<"weight: expected shape {8} [hidden], got {7}">>, fun() -> fusex:rms_norm(X, W7) end},
         {<<"weight: expected a fusex tensor, got 1.000000e+00">>, fun() -> fusex:rms_norm(X, 1.0) end},
         {<<"bias: expected shape {8} [hidden], got {7}">>, fun() -> fusex:rms_norm(X, W, #{bias => W7}) end},
         {<<"bias: expected shape {8} [hidden], got {7}">>, fun() -> fusex:layer_norm(X, W, W7) end},
         {<<"bias: expected a fusex tensor, got none">>, fun() -> fusex:layer_norm(X, W, none) end},
         {<<"residual: expected shape {2,8} [..., hidden], got {2,7}">>,
          fun() -> fusex:rms_norm(X, W, #{residual => X7}) end},
         {<<"residual: expected type {f,32}, got {f,16}">>, fun() -> fusex:rms_norm(X, W, #{residual => Half}) end},
         {<<"residual: expected type {bf,16} (x's) or {f,32}, got {f,16}">>,
          fun() -> fusex:rms_norm(Bf, W, #{residual => Half}) end},
         {<<"gate: expected type {f,32}, got {f,16}">>, fun() -> fusex:layer_norm(X, W, W, #{gate => Half}) end},
         {<<"gate: expected shape {2,8} [..., hidden], got {2,7}">>, fun() -> fusex:rms_norm(X, W, #{gate => X7}) end},
         {<<"eps: expected a finite number >= 0, got -1">>, fun() -> fusex:rms_norm(X, W, #{eps => -1}) end},
         {<<"eps: expected a number, got small">>, fun() -> fusex:rms_norm(X, W, #{eps => small}) end},
         {<<"residual_in_f32: expected true or false, got 1">>,
          fun() -> fusex:rms_norm(X, W, #{residual => X, residual_in_f32 => 1}) end},
         {<<"opts: expected only the options bias, residual, gate, eps, residual_in_f32, save_for_backward, "
            "got activation">>, fun() -> fusex:rms_norm(X, W, #{activation => silu}) end},
         {<<"opts: expected only the options residual, gate, eps, residual_in_f32, save_for_backward, got bias">>,
          fun() -> fusex:layer_norm(X, W, W, #{bias => W}) end},
         {<<"opts: expected a map, got nil">>, fun() -> fusex:layer_norm(X, W, W, nil) end},
         {<<"dy: expected shape {2,8} [..., hidden], got {2,7}">>, fun() -> fusex:rms_norm_backward(X7, Ctx) end},
         {<<"dy: expected type {f,32}, got {f,16}">>, fun() -> fusex:rms_norm_backward(Half, Ctx) end},
         {<<"ds: expected none (no residual was given), got a tensor">>,
          fun() -> fusex:rms_norm_backward(Y, Ctx, #{ds => X}) end},
         {<<"ds: expected type {f,32}, got {f,16}">>,
          fun() -> fusex:layer_norm_backward(Y, ResCtx, #{ds => Half}) end},
         {<<"opts: expected only the options ds, got dresidual">>,
          fun() -> fusex:rms_norm_backward(Y, Ctx, #{dresidual => X}) end},
         {{prefix, <<"ctx: expected a context saved by fusex:layer_norm, got #Ref<">>},
          fun() -> fusex:layer_norm_backward(Y, Ctx) end},
         {{prefix, <<"ctx: expected a context saved by fusex:rms_norm, got #Ref<">>},
          fun() -> fusex:rms_norm_backward(Y, ResCtx) end}]
        ++ gpu_only_cases(Device, X, W),
    [{lists:flatten(io_lib:format("~p", [Expected])),
      fun() -> fusex_test_util:check_badarg(Expected, F) end} || {Expected, F} <- Cases].

float_msg(cpu) -> <<"x: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}">>;
float_msg(_) -> <<"x: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}">>.

gpu_only_cases(cpu, _, _) -> [];
gpu_only_cases(_Gpu, X, W) ->
    OnCpu = fusex:copy(W, cpu),
    [{<<"weight: expected a tensor on cuda:0 (where x is), got one on cpu">>, fun() -> fusex:rms_norm(X, OnCpu) end},
     {<<"residual: expected a tensor on cuda:0 (where x is), got one on cpu">>,
      fun() -> fusex:rms_norm(X, W, #{residual => fusex:copy(X, cpu)}) end}].
