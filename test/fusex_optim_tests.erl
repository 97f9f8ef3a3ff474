%% EUnit: the optimizer API on the device under test (FUSEX_DEVICE): the
%% hand-computed two-step cases, random steps against an f64 reference
%% written here (and, on a GPU, against the CPU backend on the same
%% inputs), the skip on non-finite gradients byte for byte, the reported
%% norm against one computed here, master weights with bf16 parameters,
%% the state's memory, and every bad input with its message.
-module(fusex_optim_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, tensor/3, tensor/4, values/1]).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

%% ---- hand-computed two steps (see test/c/test_optim.c for the working) ----

lit_params(Device) ->
    [tensor({f, 32}, {3}, [1.0, -2.0, 0.5], Device), tensor({f, 32}, {1, 1}, [3.0], Device)].

lit_grads(1, Device) ->
    [tensor({f, 32}, {3}, [0.1, -0.2, 0.3], Device), tensor({f, 32}, {1, 1}, [1.0], Device)];
lit_grads(2, Device) ->
    [tensor({f, 32}, {3}, [-0.5, 0.25, 0.0], Device), tensor({f, 32}, {1, 1}, [2.0], Device)].

flat(Tensors) -> lists:append([values(T) || T <- Tensors]).

%% Each element within 1e-6 relative (+1e-9 absolute) of the literal.
assert_literal(Want, Got) ->
    ?assertEqual(length(Want), length(Got)),
    [case abs(G - W) =< 1.0e-6 * abs(W) + 1.0e-9 of
         true -> ok;
         false -> error({not_literal, #{got => G, want => W, all_got => Got}})
     end || {G, W} <- lists:zip(Got, Want)],
    ok.

adamw_two_steps_literal_test() ->
    D = device(),
    P = lit_params(D),
    S = fusex:adamw_init(P, #{lr => 0.1, weight_decay => 0.1}),
    ?assertEqual(#{step => 0, grad_norm => undefined, skipped => false}, fusex:optimizer_info(S)),
    S = fusex:adamw_step(S, P, lit_grads(1, D), #{}),
    assert_literal([0.890000009999999, -1.8800000049999999, 0.3950000033333332,
                    2.8700000009999997], flat(P)),
    assert_literal([0.01, -0.02, 0.03, 0.1], flat(maps:get(exp_avg, S))),
    assert_literal([1.0e-5, 4.0e-5, 9.0e-5, 1.0e-3], flat(maps:get(exp_avg_sq, S))),
    S = fusex:adamw_step(S, P, lit_grads(2, D), #{}),
    assert_literal([0.9409354264523341, -1.8774732303981743, 0.3240441810458211,
                    2.744781799018166], flat(P)),
    assert_literal([-0.041, 0.007, 0.027, 0.29], flat(maps:get(exp_avg, S))),
    assert_literal([0.00025999, 0.00010246, 8.991e-05, 0.004999], flat(maps:get(exp_avg_sq, S))),
    ?assertEqual(#{step => 2, grad_norm => undefined, skipped => false}, fusex:optimizer_info(S)).

adamw_amsgrad_maximize_clip_literal_test() ->
    D = device(),
    P = lit_params(D),
    S = fusex:adamw_init(P, #{lr => 0.1, weight_decay => 0.1, amsgrad => true, maximize => true}),
    %% clipping passed per step: the step's options override the defaults
    S = fusex:adamw_step(S, P, lit_grads(1, D), #{max_grad_norm => 0.5}),
    #{grad_norm := N1} = fusex:optimizer_info(S),
    ?assert(abs(N1 - 1.0677078252031311) < 1.0e-6),
    S = fusex:adamw_step(S, P, lit_grads(2, D), #{max_grad_norm => 0.5}),
    #{grad_norm := N2, step := 2} = fusex:optimizer_info(S),
    ?assert(abs(N2 - 2.0766559657295187) < 2.0e-6),
    assert_literal([1.0340250804321056, -2.0753136405319106, 0.6560223003340989,
                    3.1393629848669313], flat(P)),
    assert_literal([1.6683525035383736e-05, 1.2386326396215824e-05, 1.973680513482255e-05,
                    0.00045096237164322526], flat(maps:get(max_exp_avg_sq, S))).

sgd_two_steps_literal_test() ->
    D = device(),
    P = lit_params(D),
    S = fusex:sgd_init(P, #{lr => 0.1, momentum => 0.9, dampening => 0.1, weight_decay => 0.1}),
    S = fusex:sgd_step(S, P, lit_grads(1, D), #{}),
    assert_literal([0.98, -1.96, 0.465, 2.87], flat(P)),
    assert_literal([0.2, -0.4, 0.35, 1.3], flat(maps:get(momentum_buffer, S))),
    S = fusex:sgd_step(S, P, lit_grads(2, D), #{}),
    assert_literal([0.99818, -1.92886, 0.429315, 2.54717], flat(P)),
    assert_literal([-0.1818, -0.3114, 0.35685, 3.2283], flat(maps:get(momentum_buffer, S))).

sgd_nesterov_maximize_literal_test() ->
    D = device(),
    P = lit_params(D),
    S = fusex:sgd_init(P, #{lr => 0.1, momentum => 0.9, weight_decay => 0.1, nesterov => true,
                            maximize => true}),
    S = fusex:sgd_step(S, P, lit_grads(1, D), #{}),
    assert_literal([1.0, -2.0, 0.5475, 3.133], flat(P)),
    S = fusex:sgd_step(S, P, lit_grads(2, D), #{}),
    assert_literal([0.886, -1.9145, 0.5573475, 3.510173], flat(P)).

%% ---- random steps against a reference written here ----

f32(X) -> <<Y:32/float-native>> = <<X:32/float-native>>, Y.

%% One step of the reference over lists of lists (the f32-stored state).
ref_step(adamw, H, T, Scale, Ps, Gs, St) ->
    #{lr := Lr, beta1 := B1, beta2 := B2, eps := Eps, weight_decay := Wd,
      maximize := Max, amsgrad := Ams} = H,
    Bc1 = 1 - math:pow(B1, T), Bc2 = 1 - math:pow(B2, T),
    Sign = case Max of true -> -1; false -> 1 end,
    #{m := Ms, v := Vs, vmax := VMs} = St,
    Out = [[begin
                G = G0 * Scale * Sign,
                P1 = P * (1 - Lr * Wd),
                M1 = B1 * M + (1 - B1) * G,
                V1 = B2 * V + (1 - B2) * G * G,
                Vu = case Ams of true -> max(V1, VM); false -> V1 end,
                {f32(P1 - Lr / Bc1 * M1 / (math:sqrt(Vu) / math:sqrt(Bc2) + Eps)), f32(M1), f32(V1),
                 f32(Vu)}
            end || {P, G0, M, V, VM} <- zip5(Pt, Gt, Mt, Vt, VMt)]
           || {Pt, Gt, Mt, Vt, VMt} <- zip5(Ps, Gs, Ms, Vs, VMs)],
    {[[P || {P, _, _, _} <- L] || L <- Out],
     #{m => [[M || {_, M, _, _} <- L] || L <- Out], v => [[V || {_, _, V, _} <- L] || L <- Out],
       vmax => [[VM || {_, _, _, VM} <- L] || L <- Out]}};
ref_step(sgd, H, T, Scale, Ps, Gs, St = #{buf := Bs}) ->
    #{lr := Lr, momentum := Mu, dampening := Damp, weight_decay := Wd, nesterov := Nest,
      maximize := Max} = H,
    Sign = case Max of true -> -1; false -> 1 end,
    Out = [[begin
                G = G0 * Scale * Sign + Wd * P,
                {G1, B1} = case Mu == 0 of
                               true -> {G, B};
                               false ->
                                   Bn = case T of 1 -> G; _ -> Mu * B + (1 - Damp) * G end,
                                   {case Nest of true -> G + Mu * Bn; false -> Bn end, Bn}
                           end,
                {f32(P - Lr * G1), f32(B1)}
            end || {P, G0, B} <- lists:zip3(Pt, Gt, Bt)]
           || {Pt, Gt, Bt} <- lists:zip3(Ps, Gs, Bs)],
    {[[P || {P, _} <- L] || L <- Out], St#{buf => [[B || {_, B} <- L] || L <- Out]}}.

zip5([A | As], [B | Bs], [C | Cs], [D | Ds], [E | Es]) ->
    [{A, B, C, D, E} | zip5(As, Bs, Cs, Ds, Es)];
zip5([], [], [], [], []) -> [].

zeros_like(Lists) -> [[0.0 || _ <- L] || L <- Lists].

hyper(adamw, Extra) ->
    maps:merge(#{lr => 0.01, beta1 => 0.9, beta2 => 0.999, eps => 1.0e-8, weight_decay => 0.01,
                 maximize => false, amsgrad => false}, Extra);
hyper(sgd, Extra) ->
    maps:merge(#{lr => 0.05, momentum => 0.0, dampening => 0.0, weight_decay => 0.0,
                 nesterov => false, maximize => false}, Extra).

%% Sizes 1, 3, 130 and 1025; 3 steps; grads f32 or bf16.
random_case(Kind, Extra, GradType) ->
    D = device(),
    Sizes = [1, 3, 130, 1025],
    P0 = [[f32(X) || X <- fusex_test_util:uniform(N, -1.0, 1.0)] || N <- Sizes],
    H = hyper(Kind, Extra),
    Opts = maps:without([max_grad_norm], H),
    Ps = [tensor({f, 32}, {N}, V, D) || {N, V} <- lists:zip(Sizes, P0)],
    Init = case Kind of adamw -> fun fusex:adamw_init/2; sgd -> fun fusex:sgd_init/2 end,
    Step = case Kind of adamw -> fun fusex:adamw_step/4; sgd -> fun fusex:sgd_step/4 end,
    S = Init(Ps, Opts),
    %% on a GPU, the CPU backend on the same inputs
    Cpu = case D of
              cpu -> none;
              _ -> CPs = [fusex:copy(T, cpu) || T <- Ps], {CPs, Init(CPs, Opts)}
          end,
    Zero = zeros_like(P0),
    Ref0 = {P0, #{m => Zero, v => Zero, vmax => Zero, buf => Zero}},
    {RefP, RefS} = lists:foldl(
                  fun(T, {RP, RS}) ->
                          Gs = [[rand:normal() * 0.1 || _ <- lists:seq(1, N)] || N <- Sizes],
                          Gt = [tensor(GradType, {N}, G, D) || {N, G} <- lists:zip(Sizes, Gs)],
                          Gr = [values(G) || G <- Gt], % as rounded to the grad type
                          StepHyper = maps:with([max_grad_norm], H),
                          S = Step(S, Ps, Gt, StepHyper),
                          case Cpu of
                              none -> ok;
                              {OnCpu, CS} -> CS = Step(CS, OnCpu, [fusex:copy(G, cpu) || G <- Gt],
                                                       StepHyper)
                          end,
                          Scale = clip_scale(H, Gr),
                          ref_step(Kind, H, T, Scale, RP, Gr, RS)
                  end, Ref0, lists:seq(1, 3)),
    fusex_test_util:assert_close(flat(Ps), lists:append(RefP), 1.0e-6),
    [fusex_test_util:assert_close(flat(maps:get(Key, S)), lists:append(maps:get(RefKey, RefS)), 1.0e-6)
     || {Key, RefKey} <- [{exp_avg, m}, {exp_avg_sq, v}, {max_exp_avg_sq, vmax},
                          {momentum_buffer, buf}],
        maps:get(Key, S, []) =/= []],
    ?assertMatch(#{step := 3, skipped := false}, fusex:optimizer_info(S)),
    case Cpu of
        none -> ok;
        {CpuPs, _} -> fusex_test_util:assert_close(flat(Ps), flat(CpuPs), 1.0e-6)
    end.

clip_scale(#{max_grad_norm := Max}, Gs) -> min(1.0, Max / (norm(Gs) + 1.0e-6));
clip_scale(_, _) -> 1.0.

norm(Gs) -> math:sqrt(lists:sum([X * X || L <- Gs, X <- L])).

random_steps_match_reference_test_() ->
    Cases = [{adamw, #{}, {f, 32}},
             {adamw, #{amsgrad => true, maximize => true, weight_decay => 0.1}, {bf, 16}},
             {adamw, #{max_grad_norm => 1.0}, {f, 32}},
             {sgd, #{momentum => 0.9, dampening => 0.1, weight_decay => 0.01}, {f, 32}},
             {sgd, #{momentum => 0.9, nesterov => true, maximize => true, max_grad_norm => 0.5},
              {bf, 16}},
             {sgd, #{}, {f, 32}}],
    [{lists:flatten(io_lib:format("~p ~p ~p", [K, E, G])), fun() -> random_case(K, E, G) end}
     || {K, E, G} <- Cases].

%% ---- skip on non-finite gradients: every byte stays ----

state_bytes(S, Ps) ->
    Lists = [L || K <- [master, exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer],
                  L <- [maps:get(K, S, [])]],
    [fusex:to_binary(T) || T <- Ps ++ lists:append(Lists) ++ [maps:get(step, S)]].

%% A NaN/Inf gradient element in the bits of the grad type.
bad_value(nan, {f, 32}) -> <<16#7FC00000:32/native>>;
bad_value(inf, {f, 32}) -> <<16#7F800000:32/native>>;
bad_value(nan, {bf, 16}) -> <<16#7FC0:16/native>>;
bad_value(inf, {bf, 16}) -> <<16#FF80:16/native>>. % -Inf

grad_with(Type, N, At, Bad, D) ->
    Good = fusex_test_util:encode(Type, fusex_test_util:uniform(N, -1.0, 1.0)),
    {_, Bits} = Type,
    Skip = At * Bits div 8,
    <<Before:Skip/binary, _:Bits, After/binary>> = Good,
    fusex:tensor(<<Before/binary, (bad_value(Bad, Type))/binary, After/binary>>, Type, {N},
                 #{device => D}).

skip_case(Kind, ParamType, GradType, Bad, Clip) ->
    D = device(),
    Sizes = [5, 1025, 17],
    Ps = [tensor(ParamType, {N}, fusex_test_util:uniform(N, -1.0, 1.0), D) || N <- Sizes],
    Opts0 = #{skip_nonfinite => true, master_weights => ParamType =/= {f, 32}},
    Opts1 = case Kind of adamw -> Opts0#{amsgrad => true}; sgd -> Opts0#{momentum => 0.9} end,
    Opts = case Clip of true -> Opts1#{max_grad_norm => 1.0}; false -> Opts1 end,
    {Init, Step} = case Kind of
                       adamw -> {fun fusex:adamw_init/2, fun fusex:adamw_step/4};
                       sgd -> {fun fusex:sgd_init/2, fun fusex:sgd_step/4}
                   end,
    S = Init(Ps, Opts),
    Clean = fun() -> [tensor(GradType, {N}, fusex_test_util:uniform(N, -1.0, 1.0), D) || N <- Sizes] end,
    S = Step(S, Ps, Clean(), #{}),
    Before = state_bytes(S, Ps),
    Dirty = [hd(Clean()), grad_with(GradType, 1025, 1024, Bad, D), lists:last(Clean())],
    S = Step(S, Ps, Dirty, #{}),
    ?assertEqual(Before, state_bytes(S, Ps)),
    #{step := 1, skipped := true, grad_norm := Norm} = fusex:optimizer_info(S),
    ?assertEqual(case Bad of nan -> nan; inf -> infinity end, Norm),
    %% the next clean step runs and clears the flag
    S = Step(S, Ps, Clean(), #{}),
    ?assertMatch(#{step := 2, skipped := false}, fusex:optimizer_info(S)),
    ?assertNotEqual(Before, state_bytes(S, Ps)).

skip_nonfinite_leaves_every_byte_test_() ->
    [{lists:flatten(io_lib:format("~p ~p ~p ~p clip=~p", [K, P, G, B, C])),
      fun() -> skip_case(K, P, G, B, C) end}
     || {K, P, G} <- [{adamw, {f, 32}, {f, 32}}, {sgd, {f, 32}, {bf, 16}},
                      {adamw, {bf, 16}, {bf, 16}}],
        B <- [nan, inf], C <- [false, true]].

%% ---- the reported norm against one computed here ----

clipping_norm_test() ->
    D = device(),
    Sizes = [1, 1000, 16385, 40000],
    Ps = [fusex:zeros({f, 32}, {N}, #{device => D}) || N <- Sizes],
    Gs = [[rand:normal() || _ <- lists:seq(1, N)] || N <- Sizes],
    Gt = [tensor({f, 32}, {N}, G, D) || {N, G} <- lists:zip(Sizes, Gs)],
    Want = norm([values(G) || G <- Gt]),
    S = fusex:sgd_init(Ps, #{lr => 1.0, max_grad_norm => 2.0}),
    S = fusex:sgd_step(S, Ps, Gt, #{}),
    #{grad_norm := Got} = fusex:optimizer_info(S),
    ?assert(abs(Got - Want) =< 1.0e-6 * Want),
    %% SGD with lr 1 from zero params: p = -factor * g, factor = 2 / (norm + 1e-6)
    Factor = 2.0 / (Want + 1.0e-6),
    fusex_test_util:assert_close(flat(Ps), [-Factor * X || G <- Gt, X <- values(G)], 1.0e-6).

%% ---- master weights with bf16 parameters ----

bf16(X) -> hd(fusex_test_util:decode({bf, 16}, fusex_test_util:encode({bf, 16}, [X]))).

master_weights_bf16_test() ->
    D = device(),
    Init = fusex_test_util:uniform(300, -1.0, 1.0),
    P = tensor({bf, 16}, {300}, Init, D),
    S = fusex:adamw_init([P], #{lr => 1.0e-3, weight_decay => 0.0, master_weights => true}),
    [M] = maps:get(master, S),
    ?assertEqual({f, 32}, fusex:type(M)),
    ?assertEqual(values(P), values(M)), % the master starts as the params, exactly
    Start = values(M),
    G = [1.0 || _ <- Init],
    Steps = 20,
    [fusex:adamw_step(S, [P], [tensor({bf, 16}, {300}, G, D)], #{}) || _ <- lists:seq(1, Steps)],
    %% A constant gradient moves every element by lr per step (m/sqrt(v) is
    %% 1 after bias correction): the master ends 0.02 lower, while steps of
    %% 1e-3 applied to a bf16 parameter (ulp 2^-8..2^-7 near 0.5..1) would
    %% mostly round away.
    fusex_test_util:assert_close(values(M), [X - Steps * 1.0e-3 || X <- Start], 1.0e-5),
    ?assertEqual([bf16(X) || X <- values(M)], values(P)),
    ?assertMatch(#{step := Steps}, fusex:optimizer_info(S)).

master_weights_ignored_for_f32_test() ->
    P = tensor({f, 32}, {4}, [1.0, 2.0, 3.0, 4.0]),
    S = fusex:adamw_init([P], #{master_weights => true}),
    ?assertEqual([], maps:get(master, S)).

%% ---- the state's memory ----

state_memory_returns_test() ->
    D = device(),
    %% tensors of earlier tests are destroyed asynchronously: settle first
    Baseline = fun() ->
                       maps:with([allocated, live_tensors], fusex_test_util:settled_memory(D))
               end,
    Before = Baseline(),
    Self = self(),
    Pid = spawn(fun() ->
                        P = [fusex:zeros({f, 32}, {N}, #{device => D}) || N <- [10, 20000]],
                        S = fusex:adamw_init(P, #{amsgrad => true}),
                        %% freeing a state tensor's handle leaves the optimizer working
                        [fusex:free(T) || T <- maps:get(exp_avg, S)],
                        G = [fusex:zeros({f, 32}, {N}, #{device => D}) || N <- [10, 20000]],
                        S = fusex:adamw_step(S, P, G, #{}),
                        Self ! {self(), fusex:optimizer_info(S)}
                end),
    Ref = monitor(process, Pid),
    receive {Pid, Info} -> ?assertMatch(#{step := 1}, Info) after 30000 -> error(timeout) end,
    receive {'DOWN', Ref, process, Pid, _} -> ok end,
    ?assertEqual(Before, Baseline()).

%% ---- bad input: every message ----

-define(assertBadarg(Msg, Expr), ?assertError({badarg, Msg}, Expr)).

bad_init_test_() ->
    A = tensor({f, 32}, {3}, [1.0, 2.0, 3.0]),
    B = tensor({f, 32}, {2}, [1.0, 2.0]),
    Bf = tensor({bf, 16}, {3}, [1.0, 2.0, 3.0]),
    I = tensor({s, 32}, {3}, [1, 2, 3]),
    View = fusex:reshape(A, {3, 1}),
    Freed = tensor({f, 32}, {1}, [1.0]),
    fusex:free(Freed),
    AdamKeys = <<"lr, beta1, beta2, eps, weight_decay, maximize, amsgrad, max_grad_norm, "
                 "skip_nonfinite, master_weights">>,
    Cases =
        [{<<"params: expected a list of fusex tensors, got foo">>,
          fun() -> fusex:adamw_init(foo, #{}) end},
         {<<"params: expected a non-empty list of tensors, got []">>,
          fun() -> fusex:adamw_init([], #{}) end},
         {<<"params[1]: expected a fusex tensor, got bar">>,
          fun() -> fusex:adamw_init([A, bar], #{}) end},
         {<<"params[0]: expected a live tensor, got one released by fusex:free/1">>,
          fun() -> fusex:sgd_init([Freed], #{}) end},
         {<<"params[0]: expected type {f,32} ({bf,16} and {f,16} parameters need master_weights => true), got {bf,16}">>,
          fun() -> fusex:adamw_init([Bf], #{}) end},
         {<<"params[0]: expected type {f,32}, or {bf,16}/{f,16} with master_weights => true, got {s,32}">>,
          fun() -> fusex:adamw_init([I], #{master_weights => true}) end},
         {<<"params[1]: expected type {f,32} (the type of params[0]), got {bf,16}">>,
          fun() -> fusex:adamw_init([A, Bf], #{master_weights => true}) end},
         {<<"params[2]: expected a tensor distinct from params[0], got the same memory">>,
          fun() -> fusex:adamw_init([A, B, View], #{}) end},
         {<<"opts: expected a map, got [lr]">>, fun() -> fusex:adamw_init([A], [lr]) end},
         {<<"opts: expected only the options ", AdamKeys/binary, ", got momentum">>,
          fun() -> fusex:adamw_init([A], #{momentum => 0.9}) end},
         {<<"lr: expected a number, got fast">>, fun() -> fusex:adamw_init([A], #{lr => fast}) end},
         {<<"lr: expected a finite number >= 0, got -1">>,
          fun() -> fusex:adamw_init([A], #{lr => -1}) end},
         {<<"beta1: expected a number in [0, 1), got 1">>,
          fun() -> fusex:adamw_init([A], #{beta1 => 1.0}) end},
         {<<"beta2: expected a number in [0, 1), got 1.5">>,
          fun() -> fusex:adamw_init([A], #{beta2 => 1.5}) end},
         {<<"eps: expected a finite number >= 0, got -1e-08">>,
          fun() -> fusex:adamw_init([A], #{eps => -1.0e-8}) end},
         {<<"weight_decay: expected a finite number >= 0, got -0.1">>,
          fun() -> fusex:adamw_init([A], #{weight_decay => -0.1}) end},
         {<<"max_grad_norm: expected a finite number > 0 or none, got 0">>,
          fun() -> fusex:adamw_init([A], #{max_grad_norm => 0}) end},
         {<<"max_grad_norm: expected a finite number > 0 or none, got big">>,
          fun() -> fusex:adamw_init([A], #{max_grad_norm => big}) end},
         {<<"amsgrad: expected true or false, got yes">>,
          fun() -> fusex:adamw_init([A], #{amsgrad => yes}) end},
         {<<"master_weights: expected true or false, got 1">>,
          fun() -> fusex:sgd_init([A], #{master_weights => 1}) end},
         {<<"momentum: expected a finite number >= 0, got -0.5">>,
          fun() -> fusex:sgd_init([A], #{momentum => -0.5}) end},
         {<<"dampening: expected a number in [0, 1], got 2">>,
          fun() -> fusex:sgd_init([A], #{momentum => 0.9, dampening => 2}) end},
         {<<"nesterov: expected momentum > 0 and dampening 0 with nesterov => true, got momentum 0 and dampening 0">>,
          fun() -> fusex:sgd_init([A], #{nesterov => true}) end},
         {<<"nesterov: expected momentum > 0 and dampening 0 with nesterov => true, got momentum 0.9 and dampening 0.1">>,
          fun() -> fusex:sgd_init([A], #{nesterov => true, momentum => 0.9, dampening => 0.1}) end},
         {<<"opts: expected only the options lr, momentum, dampening, nesterov, weight_decay, maximize, max_grad_norm, skip_nonfinite, master_weights, got beta1">>,
          fun() -> fusex:sgd_init([A], #{beta1 => 0.9}) end}],
    [{binary_to_list(Msg), fun() -> ?assertBadarg(Msg, F()) end} || {Msg, F} <- Cases].

bad_step_test_() ->
    D = device(),
    A = tensor({f, 32}, {3}, [1.0, 2.0, 3.0]),
    B = tensor({f, 32}, {2}, [1.0, 2.0]),
    GA = tensor({f, 32}, {3}, [0.1, 0.2, 0.3]),
    GB = tensor({f, 32}, {2}, [0.1, 0.2]),
    GBbf = tensor({bf, 16}, {2}, [0.1, 0.2]),
    GI = tensor({s, 32}, {3}, [1, 2, 3]),
    A4 = tensor({f, 32}, {4}, [1.0, 2.0, 3.0, 4.0]),
    Freed = tensor({f, 32}, {2}, [1.0, 2.0]),
    fusex:free(Freed),
    S = fusex:adamw_init([A, B], #{}),
    Sgd = fusex:sgd_init([A, B], #{}),
    Cases =
        [{<<"state: expected an optimizer state from adamw_init/2, got nothing">>,
          fun() -> fusex:adamw_step(nothing, [A, B], [GA, GB], #{}) end},
         {<<"state: expected an AdamW state (from adamw_init), got an SGD state">>,
          fun() -> fusex:adamw_step(Sgd, [A, B], [GA, GB], #{}) end},
         {<<"state: expected an SGD state (from sgd_init), got an AdamW state">>,
          fun() -> fusex:sgd_step(S, [A, B], [GA, GB], #{}) end},
         {<<"params: expected a list of 2 tensors (as given to adamw_init), got 1">>,
          fun() -> fusex:adamw_step(S, [A], [GA], #{}) end},
         {<<"grads: expected a list of 2 tensors (one per param), got 3">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, GB, GB], #{}) end},
         {<<"params[1]: expected shape {2} (as given to adamw_init), got {4}">>,
          fun() -> fusex:adamw_step(S, [A, A4], [GA, GB], #{}) end},
         {<<"grads[0]: expected type {f,32}, {bf,16} or {f,16}, got {s,32}">>,
          fun() -> fusex:adamw_step(S, [A, B], [GI, GB], #{}) end},
         {<<"grads[1]: expected type {f,32} (the type of grads[0]), got {bf,16}">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, GBbf], #{}) end},
         {<<"grads[1]: expected shape {2} (the shape of params[1]), got {3}">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, GA], #{}) end},
         {<<"grads[1]: expected a live tensor, got one released by fusex:free/1">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, Freed], #{}) end},
         {<<"grads[0]: expected a tensor distinct from every param, got the memory of params[0]">>,
          fun() -> fusex:adamw_step(S, [A, B], [A, GB], #{}) end},
         {<<"amsgrad: expected false (fixed by adamw_init, which did not allocate max_exp_avg_sq), got true">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, GB], #{amsgrad => true}) end},
         {<<"opts: expected only the options lr, beta1, beta2, eps, weight_decay, maximize, amsgrad, max_grad_norm, skip_nonfinite, got master_weights">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, GB], #{master_weights => true}) end},
         {<<"lr: expected a finite number >= 0, got -0.001">>,
          fun() -> fusex:adamw_step(S, [A, B], [GA, GB], #{lr => -1.0e-3}) end},
         {<<"momentum: expected 0 (sgd_init was given momentum 0, so the state holds no momentum buffers), got 0.9">>,
          fun() -> fusex:sgd_step(Sgd, [A, B], [GA, GB], #{momentum => 0.9}) end},
         {<<"opts: expected a map, got []">>,
          fun() -> fusex:sgd_step(Sgd, [A, B], [GA, GB], []) end}]
        ++ case D of
               cpu -> [];
               _ ->
                   Host = tensor({f, 32}, {2}, [0.1, 0.2], cpu),
                   [{<<"grads[1]: expected a tensor on cuda:0 (where the optimizer state is), got one on cpu">>,
                     fun() -> fusex:adamw_step(S, [A, B], [GA, Host], #{}) end}]
           end,
    [{binary_to_list(Msg), fun() -> ?assertBadarg(Msg, F()) end} || {Msg, F} <- Cases]
        ++ [{"nothing changed by the bad steps",
             fun() ->
                     ?assertMatch(#{step := 0}, fusex:optimizer_info(S)),
                     ?assertEqual([1.0, 2.0, 3.0], values(A)),
                     S = fusex:adamw_step(S, [A, B], [GA, GB], #{}),
                     ?assertMatch(#{step := 1}, fusex:optimizer_info(S))
             end}].

optimizer_info_bad_input_test() ->
    ?assertBadarg(<<"state: expected an optimizer state from adamw_init/2 or sgd_init/2, got #{}">>,
                  fusex:optimizer_info(#{})).

%% ---- concurrency ----

%% Processes with their own optimizers, and processes sharing one state:
%% steps on one state run one at a time, so every one of them counts.
concurrent_steps_test() ->
    D = device(),
    Parent = self(),
    Own = [spawn_link(fun() ->
                              P = [fusex:zeros({f, 32}, {N}, #{device => D}) || N <- [7, 3000]],
                              G = [tensor({f, 32}, {N}, fusex_test_util:uniform(N, -1.0, 1.0), D)
                                   || N <- [7, 3000]],
                              S = fusex:adamw_init(P, #{max_grad_norm => 1.0}),
                              [fusex:adamw_step(S, P, G, #{}) || _ <- lists:seq(1, 25)],
                              Parent ! {self(), maps:get(step, fusex:optimizer_info(S))}
                      end) || _ <- lists:seq(1, 6)],
    ?assertEqual(lists:duplicate(6, 25), [receive {Pid, N} -> N after 60000 -> timeout end || Pid <- Own]),
    P = [fusex:zeros({f, 32}, {N}, #{device => D}) || N <- [5, 20000]],
    S = fusex:sgd_init(P, #{momentum => 0.9}),
    Shared = [spawn_link(fun() ->
                                 %% each process its own grads: the table changes every step
                                 G = [tensor({f, 32}, {N}, fusex_test_util:uniform(N, -1.0, 1.0), D)
                                      || N <- [5, 20000]],
                                 [fusex:sgd_step(S, P, G, #{}) || _ <- lists:seq(1, 30)],
                                 Parent ! {self(), done}
                         end) || _ <- lists:seq(1, 4)],
    [receive {Pid, done} -> ok after 60000 -> error(timeout) end || Pid <- Shared],
    ?assertMatch(#{step := 120, skipped := false}, fusex:optimizer_info(S)),
    ?assert(lists:all(fun is_float/1, flat(P))).
