%% EUnit: the ops' descriptions through the Erlang API: fusex:op_list/0
%% lists what the op layer describes, and fusex:op_check/4 on shapes and
%% types alone gives the results a run returns, and refuses bad input with
%% the message the run raises.
-module(fusex_op_tests).

-include_lib("eunit/include/eunit.hrl").

z(Shape) -> fusex:zeros({f, 32}, Shape, #{device => fusex_test_util:device()}).

spec(T) -> {fusex:type(T), fusex:shape(T)}.

op_list_test() ->
    Ops = fusex:op_list(),
    ?assertEqual([selective_scan_fwd, selective_scan_bwd, selective_scan_step,
                  linear_scan_fwd, linear_scan_bwd, linear_scan_step,
                  mingru_fwd, mingru_bwd, mingru_step, minlstm_fwd, minlstm_bwd, minlstm_step,
                  liquid_fwd, liquid_bwd, liquid_step,
                  causal_conv1d_fwd, causal_conv1d_bwd, causal_conv1d_step,
                  rms_norm_fwd, rms_norm_bwd, layer_norm_fwd, layer_norm_bwd,
                  gru_fwd, gru_bwd, gru_step, lstm_fwd, lstm_bwd, lstm_step,
                  linear_fwd, linear_bwd], [N || #{name := N} <- Ops]),
    ?assertEqual(lists:seq(0, 29), [I || #{index := I} <- Ops]),
    %% the linear layers are no XLA targets: no target, and listed last
    ?assertEqual([linear_fwd, linear_bwd], [N || D = #{name := N} <- Ops, not maps:is_key(target, D)]),
    [Conv] = [D || D = #{name := causal_conv1d_fwd} <- Ops],
    ?assertMatch(#{target := <<"fusex_causal_conv1d_fwd">>, saved_by := <<"fusex:causal_conv1d">>,
                   options := [bias, activation, initial_state, return_state, save_for_backward]}, Conv),
    ?assertMatch([#{name := activation, kind := enum, role := option, default := 0, choices := [none, silu]} | _],
                 maps:get(attrs, Conv)),
    [Lin] = [D || D = #{name := linear_fwd} <- Ops],
    ?assertMatch([#{kind := enum, choices := [none, relu, gelu, silu, tanh, sigmoid]} | _], maps:get(attrs, Lin)),
    ?assertMatch([#{name := y, role := output, kept := true}, #{name := pre, role := saved, presence := rule}],
                 maps:get(results, Lin)),
    [Rms] = [D || D = #{name := rms_norm_fwd} <- Ops],
    ?assertMatch([#{name := eps, kind := number, default := 1.0e-5} | _], maps:get(attrs, Rms)),
    ?assertMatch([#{name := y}, #{name := s, role := output, flag := has_residual, kept := true},
                  #{name := rstd, role := saved, flag := save}], maps:get(results, Rms)),
    [Liquid] = [D || D = #{name := liquid_fwd} <- Ops],
    ?assertMatch(#{op := liquid, family := linrec, dir := fwd, target := <<"fusex_liquid_fwd">>,
                   backward := liquid_bwd, saved_by := <<"fusex:liquid">>,
                   options := [h0, return_state, reverse, save_for_backward, dt]}, Liquid),
    ?assertEqual([reverse, has_dt, has_h0, return_state, dt], [N || #{name := N} <- maps:get(attrs, Liquid)]),
    ?assertMatch([_, _, _, _, #{name := dt, kind := number, role := option, default := 1.0, positive := true}],
                 maps:get(attrs, Liquid)),
    ?assertMatch([#{name := f_logits, role := arg, presence := always, layout := <<"[batch, seqlen, hidden]">>},
                  #{name := tau}, #{name := a},
                  #{name := dt, role := option, presence := flag, flag := has_dt, layout := <<"[batch, seqlen, 1]">>},
                  #{name := h0, flag := has_h0}], maps:get(inputs, Liquid)),
    ?assertMatch([#{name := h, role := output, kept := true}, #{name := state, flag := return_state}],
                 maps:get(results, Liquid)),
    [Gru] = [D || D = #{name := mingru_step} <- Ops],
    ?assertMatch(#{options := [candidate_activation]}, Gru),
    ?assertNot(maps:is_key(backward, Gru)),
    ?assertMatch([_, #{name := candidate_g, option := candidate_activation, choices := [identity, g]}],
                 maps:get(attrs, Gru)),
    [Scan] = [D || D = #{name := selective_scan_bwd} <- Ops],
    ?assertMatch(#{name := saved, role := saved, presence := rule}, lists:nth(10, maps:get(inputs, Scan))).

%% The specs op_check gives are the run's results, saved states included
%% (the context keeps those: their shape is the saved-shape rule's).
op_check_gives_the_results_test() ->
    Device = fusex_test_util:device(),
    X = z({2, 40, 8}), A = z({8, 4}), B = z({2, 40, 4}), H0 = z({2, 8, 4}),
    Specs = fusex:op_check(selective_scan_fwd, #{x => spec(X), dt => spec(X), a => spec(A), b => spec(B),
                                                 c => spec(B), h0 => spec(H0)},
                           #{return_state => true, save => true}, Device),
    {Y, State} = fusex:selective_scan(X, X, A, B, B, #{h0 => H0, return_state => true}),
    ?assertEqual(#{y => spec(Y), state => spec(State),
                   saved => {{f, 32}, fusex:selective_scan_saved_shape({2, 40, 8}, {2, 40, 4}, {f, 32})}},
                 Specs),
    S = z({2, 5}), Dt = z({2, 1}), Hid = z({5}),
    ?assertEqual(#{h => {{f, 32}, {2, 5}}, new_state => {{f, 32}, {2, 5}}},
                 fusex:op_check(liquid_step, #{state => spec(S), f_logits => spec(S), tau => spec(Hid),
                                               a => spec(Hid), dt => spec(Dt)}, #{}, Device)),
    ?assertEqual(#{h => {{f, 32}, {2, 3, 5}}},
                 fusex:op_check(mingru_fwd, #{z_logits => {{f, 32}, {2, 3, 5}}, cand => {{f, 32}, {2, 3, 5}}},
                                #{candidate_activation => g, reverse => true}, Device)),
    ?assertEqual(#{dz_logits => {{bf, 16}, {2, 3, 5}}, dcand => {{bf, 16}, {2, 3, 5}}},
                 fusex:op_check(mingru_bwd, #{z_logits => {{bf, 16}, {2, 3, 5}}, cand => {{bf, 16}, {2, 3, 5}},
                                              h => {{bf, 16}, {2, 3, 5}}, dh => {{bf, 16}, {2, 3, 5}}},
                                #{}, Device)),
    %% the layers: a norm's s and statistics, a linear layer's pre by its activation, enums by name or index
    Xn = {{bf, 16}, {3, 4, 8}}, Wn = {{f, 32}, {8}},
    ?assertEqual(#{y => Xn, s => {{f, 32}, {3, 4, 8}}, mean => {{f, 32}, {12}}, rstd => {{f, 32}, {12}}},
                 fusex:op_check(layer_norm_fwd, #{x => Xn, weight => Wn, bias => Wn, residual => Xn},
                                #{residual_in_f32 => true, save => true}, Device)),
    Xl = {{f, 32}, {2, 3, 6}}, Wl = {{f, 32}, {5, 6}},
    ?assertEqual(#{y => {{f, 32}, {2, 3, 5}}, pre => {{f, 32}, {2, 3, 5}}},
                 fusex:op_check(linear_fwd, #{x => Xl, w => Wl}, #{activation => gelu, save => true}, Device)),
    ?assertEqual(#{y => {{f, 32}, {2, 3, 5}}},
                 fusex:op_check(linear_fwd, #{x => Xl, w => Wl}, #{activation => 1, save => true}, Device)),
    ?assertEqual(#{y => {{f, 32}, {2, 9, 4}}, final_state => {{f, 32}, {2, 4, 6}}},
                 fusex:op_check(causal_conv1d_fwd, #{x => {{f, 32}, {2, 9, 4}}, w => {{f, 32}, {4, 7}}},
                                #{activation => silu, return_state => true}, Device)).

%% The same bad input to the run and to the check: the same message. (One
%% test, its tensors its own: tensors a generator made would outlive it.)
op_check_refuses_as_the_run_does_test() ->
    Device = fusex_test_util:device(),
    X = z({2, 3, 4}), Wide = z({2, 3, 5}), Hid = z({4}), S = z({2, 4}),
    Half = fusex:convert(X, {f, 16}),
    Cases =
        [{fun() -> fusex:mingru(X, Half) end,
          {mingru_fwd, #{z_logits => spec(X), cand => spec(Half)}, #{}}},
         {fun() -> fusex:linear_scan(X, Wide) end,
          {linear_scan_fwd, #{a => spec(X), b => spec(Wide)}, #{}}},
         {fun() -> fusex:liquid(X, Hid, Hid, #{dt => Wide}) end,
          {liquid_fwd, #{f_logits => spec(X), tau => spec(Hid), a => spec(Hid), dt => spec(Wide)}, #{}}},
         {fun() -> fusex:liquid_step(S, S, z({5}), Hid, #{}) end,
          {liquid_step, #{state => spec(S), f_logits => spec(S), tau => {{f, 32}, {5}}, a => spec(Hid)}, #{}}},
         {fun() -> fusex:mingru(X, X, #{h0 => z({2, 5})}) end,
          {mingru_fwd, #{z_logits => spec(X), cand => spec(X), h0 => {{f, 32}, {2, 5}}}, #{}}},
         {fun() -> fusex:selective_scan(X, X, z({4, 3}), z({2, 3, 2}), z({2, 3, 2}), #{}) end,
          {selective_scan_fwd, #{x => spec(X), dt => spec(X), a => {{f, 32}, {4, 3}}, b => {{f, 32}, {2, 3, 2}},
                                 c => {{f, 32}, {2, 3, 2}}}, #{}}},
         {fun() -> fusex:causal_conv1d(X, z({4, 3}), #{initial_state => z({2, 4, 3})}) end,
          {causal_conv1d_fwd, #{x => spec(X), w => {{f, 32}, {4, 3}}, initial_state => {{f, 32}, {2, 4, 3}}}, #{}}},
         {fun() -> fusex:causal_conv1d_step(z({2, 4, 2}), S, z({4, 4})) end,
          {causal_conv1d_step, #{state => {{f, 32}, {2, 4, 2}}, x => spec(S), w => {{f, 32}, {4, 4}}}, #{}}},
         {fun() -> fusex:rms_norm(X, Hid, #{gate => Wide}) end,
          {rms_norm_fwd, #{x => spec(X), weight => spec(Hid), gate => spec(Wide)}, #{}}},
         {fun() -> fusex:layer_norm(X, Hid, Hid, #{eps => -1.0}) end,
          {layer_norm_fwd, #{x => spec(X), weight => spec(Hid), bias => spec(Hid)}, #{eps => -1.0}}},
         {fun() -> fusex:linear(X, z({5, 3})) end, {linear_fwd, #{x => spec(X), w => {{f, 32}, {5, 3}}}, #{}}},
         {fun() -> fusex:selective_scan_step(z({2, 4, 3}), S, S, z({4, 3}), z({2, 3}), z({2, 3}),
                                             #{d => z({5})}) end,
          {selective_scan_step, #{state => {{f, 32}, {2, 4, 3}}, x => spec(S), dt => spec(S),
                                  a => {{f, 32}, {4, 3}}, b => {{f, 32}, {2, 3}}, c => {{f, 32}, {2, 3}},
                                  d => {{f, 32}, {5}}}, #{}}}],
    [begin
         {badarg, Msg} = fusex:op_check(Name, Inputs, Attrs, Device),
         ?assertError({badarg, Msg}, Run())
     end || {Run, {Name, Inputs, Attrs}} <- Cases],
    ok.

op_check_bad_terms_test() ->
    Inputs = #{z_logits => {{f, 32}, {2, 3, 4}}, cand => {{f, 32}, {2, 3, 4}}},
    ?assertEqual({badarg, <<"inputs: expected only the inputs z_logits, cand, h0, got z">>},
                 fusex:op_check(mingru_fwd, #{z => {{f, 32}, {2}}}, #{}, cpu)),
    ?assertEqual({badarg, <<"attrs: expected only the attributes reverse, candidate_g, has_h0, return_state, "
                            "got dt">>},
                 fusex:op_check(mingru_fwd, Inputs, #{dt => 1}, cpu)),
    ?assertEqual({badarg, <<"candidate_g: expected a number, true, false, identity or g, got relu">>},
                 fusex:op_check(mingru_fwd, Inputs, #{candidate_activation => relu}, cpu)),
    ?assertEqual({badarg, <<"has_h0: expected 0 (as the inputs given say), got 1">>},
                 fusex:op_check(mingru_fwd, Inputs, #{has_h0 => true}, cpu)),
    ?assertEqual({badarg, <<"reverse: expected 0 or 1, got 2">>},
                 fusex:op_check(mingru_fwd, Inputs, #{reverse => 2}, cpu)),
    Conv = #{x => {{f, 32}, {2, 3, 4}}, w => {{f, 32}, {4, 4}}},
    ?assertEqual({badarg, <<"activation: expected a number, none or silu, got relu">>},
                 fusex:op_check(causal_conv1d_fwd, Conv, #{activation => relu}, cpu)),
    ?assertEqual({badarg, <<"activation: expected a number, none or silu, got true">>},
                 fusex:op_check(causal_conv1d_fwd, Conv, #{activation => true}, cpu)),
    ?assertEqual({badarg, <<"activation: expected 0 to 1 (none or silu), got 2">>},
                 fusex:op_check(causal_conv1d_fwd, Conv, #{activation => 2}, cpu)),
    ?assertMatch({badarg, <<"op: expected the name of a described op", _/binary>>},
                 fusex:op_check(mingru, Inputs, #{}, cpu)),
    ?assertMatch({badarg, <<"cand: expected {Type, Shape}, got", _/binary>>},
                 fusex:op_check(mingru_fwd, Inputs#{cand => f32}, #{}, cpu)),
    ?assertMatch({badarg, <<"device: expected cpu, cuda or {cuda, N}", _/binary>>},
                 fusex:op_check(mingru_fwd, Inputs, #{}, gpu)).

%% fusex:op_run/3 runs any description on its inputs by name: a forward as
%% the public function computes it, its backward (the stateless call an
%% XLA program makes) as the backward from a context, and a step in place.
op_run_test() ->
    fusex_test_util:seed(),
    U = fun(Shape) -> fusex_test_util:tensor({f, 32}, Shape, fusex_test_util:uniform(prod(Shape), -1.0, 1.0)) end,
    Z = U({2, 9, 3}), C = U({2, 9, 3}), H0 = U({2, 3}), Dh = U({2, 9, 3}),
    #{h := H} = fusex:op_run(mingru_fwd, #{z_logits => Z, cand => C, h0 => H0}, #{}),
    {Want, Ctx} = fusex:mingru(Z, C, #{h0 => H0, save_for_backward => true}),
    fusex_test_util:assert_close(fusex_test_util:values(H), fusex_test_util:values(Want), 1.0e-6),
    Grads = fusex:op_run(mingru_bwd, #{z_logits => Z, cand => C, h0 => H0, h => H, dh => Dh}, #{}),
    WantGrads = fusex:mingru_backward(Dh, Ctx, #{}),
    [fusex_test_util:assert_close(fusex_test_util:values(maps:get(list_to_atom("d" ++ atom_to_list(K)), Grads)),
                                  fusex_test_util:values(V), 1.0e-6) || {K, V} <- maps:to_list(WantGrads)],
    %% a step: new_state is the state, updated in place
    State = U({2, 3}), Zt = U({2, 3}), Ct = U({2, 3}),
    Copy = fusex:copy(State, fusex:device(State)),
    #{h := Ht, new_state := New} = fusex:op_run(mingru_step, #{state => State, z_logits => Zt, cand => Ct}, #{}),
    ?assertEqual(fusex_test_util:values(State), fusex_test_util:values(New)),
    WantHt = fusex:mingru_step(Copy, Zt, Ct, #{}),
    fusex_test_util:assert_close(fusex_test_util:values(Ht), fusex_test_util:values(WantHt), 1.0e-6),
    fusex_test_util:assert_close(fusex_test_util:values(State), fusex_test_util:values(Copy), 1.0e-6),
    %% bad input: the op layer's messages, naming the argument
    fusex_test_util:check_badarg({prefix, <<"cand: expected shape {2,9,3}">>},
                                 fun() -> fusex:op_run(mingru_fwd, #{z_logits => Z, cand => H0}, #{}) end),
    fusex_test_util:check_badarg({prefix, <<"inputs: expected a map">>}, fun() -> fusex:op_run(mingru_fwd, [Z, C], #{}) end),
    fusex_test_util:check_badarg({prefix, <<"names: expected only the inputs">>},
                                 fun() -> fusex:op_run(mingru_fwd, #{x => Z, cand => C}, #{}) end),
    fusex_test_util:check_badarg({prefix, <<"op: expected the name of a described op">>},
                                 fun() -> fusex:op_run(nope_fwd, #{z_logits => Z}, #{}) end).

prod(Shape) -> lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)).
