%% EUnit: resident models (docs/MODELS.md) on the device under test: a
%% chain of model_step frames equals model_forward over the window, a
%% window split in two equals it whole, and both equal the layers called
%% one by one (the fusex ops, and an Erlang GRU/LSTM), on awkward sizes;
%% gradients of both losses against central differences (f64, cpu); the
%% training step lowers the loss; the cpu and a GPU agree; bad specs,
%% weights, frames, states and targets are refused with their messages.
-module(fusex_model_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, values/1]).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

-define(F32_TOL, 1.0e-5).

t(Type, Shape, Values) -> fusex_test_util:tensor(Type, Shape, Values, device()).

close(Got, Want, Tol) -> fusex_test_util:assert_close(Got, Want, Tol).


%% Specs of every layer kind, with widths that fit no tile: hidden 1,
%% odd widths, a residual on every kind that can take one.
specs() ->
    [#{input => 5, seed => 11,
       layers => [{linear, #{out => 7, activation => tanh}}, {mingru, #{hidden => 6}},
                  {gru, #{hidden => 6, residual => true}}, rms_norm, {linear, #{out => 3}}]},
     #{input => 3, seed => 12,
       layers => [{minlstm, #{hidden => 5, bias => false}}, {lstm, #{hidden => 5, residual => true}},
                  {layer_norm, #{residual => true}}, {linear, #{out => 2, activation => gelu}}]},
     #{input => 1, seed => 13, layers => [{gru, #{hidden => 1}}, {mingru, #{hidden => 1, residual => true}}]},
     #{input => 4, seed => 14,
       layers => [{linear, #{out => 4, activation => silu, residual => true}}, {lstm, #{hidden => 9}},
                  {layer_norm, #{bias => false, eps => 1.0e-3}}, {minlstm, #{hidden => 2}}]},
     #{input => 6, seed => 15,
       layers => [{mamba, #{d_state => 5, d_conv => 3, expand => 3}}, rms_norm,
                  {mamba, #{d_state => 16, residual => true}}, {linear, #{out => 2}}]}].

%% [B, L, W] flat -> the frame t, [B, W] flat.
frame_of(Values, {B, L, W}, T) ->
    lists:append([lists:sublist(Values, (Bi * L + T) * W + 1, W) || Bi <- lists:seq(0, B - 1)]).

%% Frames [B, W] (one list per t) -> [B, L, W] flat.
window_of(Frames, B, W) ->
    lists:append([lists:append([lists:sublist(F, Bi * W + 1, W) || F <- Frames]) || Bi <- lists:seq(0, B - 1)]).

%% The window [B, L, W] cut to the frames in [From, To).
slice(Values, {B, L, W}, From, To) ->
    window_of([frame_of(Values, {B, L, W}, T) || T <- lists:seq(From, To - 1)], B, W).

step_chain_equals_forward_test_() ->
    [{lists:flatten(io_lib:format("spec ~b", [I])), fun() -> step_chain(Spec) end}
     || {I, Spec} <- lists:zip(lists:seq(1, length(specs())), specs())].

step_chain(Spec = #{input := In}) ->
    M = fusex:model(device(), Spec),
    #{output := Out} = fusex:model_info(M),
    {B, L} = {3, 11},
    Xs = fusex_test_util:uniform(B * L * In, -1.0, 1.0),
    {Y, _} = fusex:model_forward(M, t({f, 32}, {B, L, In}, Xs)),
    ?assertEqual({B, L, Out}, fusex:shape(Y)),
    S = fusex:model_init_state(M, B),
    Frames = [begin
                  {O, S} = fusex:model_step(M, S, t({f, 32}, {B, In}, frame_of(Xs, {B, L, In}, T))),
                  values(O)
              end || T <- lists:seq(0, L - 1)],
    close(window_of(Frames, B, Out), values(Y), ?F32_TOL),
    %% The window in two: the state carries over, and a frame after it
    %% continues where the window ended.
    K = 4,
    {Y1, S2} = fusex:model_forward(M, t({f, 32}, {B, K, In}, slice(Xs, {B, L, In}, 0, K))),
    {Y2, S2} = fusex:model_forward(M, t({f, 32}, {B, L - K - 1, In}, slice(Xs, {B, L, In}, K, L - 1)), S2),
    {O, S2} = fusex:model_step(M, S2, t({f, 32}, {B, In}, frame_of(Xs, {B, L, In}, L - 1))),
    Joined = window_of([frame_of(values(Y1), {B, K, Out}, T) || T <- lists:seq(0, K - 1)] ++
                       [frame_of(values(Y2), {B, L - K - 1, Out}, T) || T <- lists:seq(0, L - K - 2)] ++
                       [values(O)], B, Out),
    close(Joined, values(Y), ?F32_TOL),
    %% A reset state starts over.
    ok = fusex:model_reset_state(M, S2),
    {O0, S2} = fusex:model_step(M, S2, t({f, 32}, {B, In}, frame_of(Xs, {B, L, In}, 0))),
    close(values(O0), hd(Frames), ?F32_TOL).

%% ---- the layers one by one ----

forward_equals_layers_test_() ->
    [{lists:flatten(io_lib:format("spec ~b", [I])), fun() -> by_layers(Spec) end}
     || {I, Spec} <- lists:zip(lists:seq(1, length(specs())), specs())].

by_layers(Spec = #{input := In, layers := Layers}) ->
    M = fusex:model(device(), Spec),
    {B, L} = {2, 7},
    Xs = fusex_test_util:uniform(B * L * In, -1.0, 1.0),
    X = t({f, 32}, {B, L, In}, Xs),
    {Y, _} = fusex:model_forward(M, X),
    Want = lists:foldl(fun({Layer, W}, Acc) -> layer(Layer, W, Acc) end, X,
                       lists:zip(Layers, fusex:model_weights(M))),
    close(values(Y), values(Want), ?F32_TOL).

opts_of({_, Opts}) -> Opts;
opts_of(_) -> #{}.
kind_of({Kind, _}) -> Kind;
kind_of(Kind) -> Kind.

layer(Layer, W, X) ->
    Y = layer_alone(kind_of(Layer), opts_of(Layer), W, X),
    case maps:get(residual, opts_of(Layer), false) of
        true -> fusex:add(X, Y);
        false -> Y
    end.

with_bias(W, Key, Opts) ->
    case W of
        #{Key := B} -> Opts#{bias => B};
        _ -> Opts
    end.

proj(X, W, WKey, BKey) -> fusex:linear(X, maps:get(WKey, W), with_bias(W, BKey, #{})).

layer_alone(linear, Opts, W, X) ->
    fusex:linear(X, maps:get(w, W), with_bias(W, b, #{activation => maps:get(activation, Opts, none)}));
layer_alone(rms_norm, Opts, W, X) ->
    fusex:rms_norm(X, maps:get(weight, W), #{eps => maps:get(eps, Opts, 1.0e-5)});
layer_alone(layer_norm, Opts, W, X) ->
    Bias = case W of
               #{bias := B} -> B;
               _ -> fusex:zeros({f, 32}, fusex:shape(maps:get(weight, W)), #{device => device()})
           end,
    fusex:layer_norm(X, maps:get(weight, W), Bias, #{eps => maps:get(eps, Opts, 1.0e-5)});
layer_alone(mingru, _, W, X) ->
    fusex:mingru(proj(X, W, w_z, b_z), proj(X, W, w_h, b_h));
layer_alone(minlstm, _, W, X) ->
    fusex:minlstm(proj(X, W, w_f, b_f), proj(X, W, w_i, b_i), proj(X, W, w_h, b_h));
layer_alone(mamba, _, W, X) ->
    P = fun(Key, In) -> fusex:linear(In, maps:get(Key, W)) end,
    U = fusex:causal_conv1d(P(w_in_x, X), maps:get(w_conv, W), #{bias => maps:get(b_conv, W), activation => silu}),
    Dt = P(w_dt, P(w_x_dt, U)),
    Y = fusex:selective_scan(U, Dt, maps:get(a, W), P(w_x_b, U), P(w_x_c, U),
                             #{d => maps:get(d, W), z => P(w_in_z, X), dt_bias => maps:get(b_dt, W),
                               dt_softplus => true}),
    P(w_out, Y);
layer_alone(Cell, _, W, X) when Cell =:= gru; Cell =:= lstm ->
    {B, L, In} = fusex:shape(X),
    H = element(1, fusex:shape(maps:get(w_hh, W))) div gates(Cell),
    Ys = rnn_reference(Cell, {B, L, In, H}, values(X), W),
    t({f, 32}, {B, L, H}, Ys).

gates(gru) -> 3;
gates(lstm) -> 4.

rows([], _Width) -> [];
rows(Values, Width) ->
    case length(Values) =< Width of
        true -> [Values];
        false -> {Row, Rest} = lists:split(Width, Values), [Row | rows(Rest, Width)]
    end.

matvec(Rows, V) -> [fusex_test_util:dot(R, V) || R <- Rows].

%% PyTorch's nn.GRU / nn.LSTM, one layer, straight from the equations.
rnn_reference(Cell, {B, L, In, H}, Xs, W) ->
    Wih = rows(values(maps:get(w_ih, W)), In),
    Whh = rows(values(maps:get(w_hh, W)), H),
    Zeros = lists:duplicate(gates(Cell) * H, 0.0),
    Bih = case W of #{b_ih := Bi} -> values(Bi); _ -> Zeros end,
    Bhh = case W of #{b_hh := Bh} -> values(Bh); _ -> Zeros end,
    PerBatch = [begin
                    Seq = rows(lists:sublist(Xs, Bi * L * In + 1, L * In), In),
                    run_cell(Cell, Seq, H, Wih, Whh, Bih, Bhh)
                end || Bi <- lists:seq(0, B - 1)],
    lists:append(PerBatch).

run_cell(Cell, Seq, H, Wih, Whh, Bih, Bhh) ->
    Zero = lists:duplicate(H, 0.0),
    {_, Out} = lists:foldl(
                 fun(X, {{Hp, Cp}, Acc}) ->
                         Ax = lists:zipwith(fun erlang:'+'/2, matvec(Wih, X), Bih),
                         Ah = lists:zipwith(fun erlang:'+'/2, matvec(Whh, Hp), Bhh),
                         {Hn, Cn} = cell(Cell, rows(Ax, H), rows(Ah, H), Hp, Cp),
                         {{Hn, Cn}, Acc ++ Hn}
                 end, {{Zero, Zero}, []}, Seq),
    Out.

sig(V) -> fusex_test_util:sig(V).

cell(gru, [Axr, Axz, Axn], [Ahr, Ahz, Ahn], Hp, Cp) ->
    R = [sig(A + B) || {A, B} <- lists:zip(Axr, Ahr)],
    Z = [sig(A + B) || {A, B} <- lists:zip(Axz, Ahz)],
    N = [math:tanh(A + Ri * B) || {A, Ri, B} <- lists:zip3(Axn, R, Ahn)],
    {[(1 - Zi) * Ni + Zi * P || {Zi, Ni, P} <- lists:zip3(Z, N, Hp)], Cp};
cell(lstm, [Axi, Axf, Axg, Axo], [Ahi, Ahf, Ahg, Aho], _Hp, Cp) ->
    I = [sig(A + B) || {A, B} <- lists:zip(Axi, Ahi)],
    F = [sig(A + B) || {A, B} <- lists:zip(Axf, Ahf)],
    G = [math:tanh(A + B) || {A, B} <- lists:zip(Axg, Ahg)],
    O = [sig(A + B) || {A, B} <- lists:zip(Axo, Aho)],
    C = [Fi * P + Ii * Gi || {{Fi, P}, {Ii, Gi}} <- lists:zip(lists:zip(F, Cp), lists:zip(I, G))],
    {[Oi * math:tanh(Ci) || {Oi, Ci} <- lists:zip(O, C)], C}.

%% ---- gradients ----

grad_spec(Type) ->
    #{input => 3, type => Type, seed => 21,
      layers => [{linear, #{out => 4, activation => tanh}}, {mingru, #{hidden => 3}},
                 {gru, #{hidden => 3, residual => true}}, {minlstm, #{hidden => 3}},
                 {lstm, #{hidden => 5}}, {rms_norm, #{residual => true}}, layer_norm,
                 {mamba, #{d_state => 3, d_conv => 3, expand => 2, residual => true}},
                 {linear, #{out => 3, activation => silu}}]}.

%% Every parameter's gradient against central differences of the loss
%% (f64 on the cpu, a five-point stencil: its own error is far below the
%% tolerance; every layer's gradients agree to 1e-9 or better but those
%% of mamba's dt path, whose quotients the loss's rounding leaves near
%% 1e-6). Mamba's dt_proj bias is raised from its initial
%% softplus^-1 of 1e-3..1e-1 to dt of order 1: with dt that small the
%% gradients of A and of the dt path are so small against the loss that
%% the loss's own rounding drowns their difference quotients.
gradients_mse_test() -> check_gradients(mse).
gradients_cross_entropy_test() -> check_gradients(cross_entropy).

check_gradients(Loss) ->
    T64 = fun(Shape, V) -> fusex_test_util:tensor({f, 64}, Shape, V, cpu) end,
    M = fusex:model(cpu, grad_spec({f, 64})),
    #{b_dt := Bdt} = lists:nth(8, fusex:model_weights(M)),
    ok = fusex:copy_into(T64(fusex:shape(Bdt), fusex_test_util:uniform(element(1, fusex:shape(Bdt)), 0.0, 1.0)), Bdt),
    {B, L} = {2, 3},
    X = T64({B, L, 3}, fusex_test_util:uniform(B * L * 3, -1.0, 1.0)),
    Targets = case Loss of
                  mse -> T64({B, L, 3}, fusex_test_util:uniform(B * L * 3, -1.0, 1.0));
                  cross_entropy -> fusex_test_util:tensor({s, 32}, {B, L}, [rand:uniform(3) - 1 || _ <- lists:seq(1, B * L)], cpu)
              end,
    Opts = #{loss => Loss},
    {Value, Grads} = fusex:model_gradients(M, X, Targets, Opts),
    ?assert(abs(Value - fusex:model_loss(M, X, Targets, Opts)) =< 1.0e-12 * abs(Value)),
    Params = fusex:model_params(M),
    ?assertEqual(length(Params), length(Grads)),
    lists:foreach(
      fun({P, G}) ->
              Vs = values(P),
              LossAt = fun(Ws) ->
                               ok = fusex:copy_into(T64(fusex:shape(P), Ws), P),
                               fusex:model_loss(M, X, Targets, Opts)
                       end,
              Numeric = central_differences(LossAt, Vs, 1.0e-3),
              ok = fusex:copy_into(T64(fusex:shape(P), Vs), P),
              close(values(G), Numeric, 1.0e-5)
      end, lists:zip(Params, Grads)).

%% The five-point stencil: its error is O(h^4), so a step large enough
%% for the loss's rounding (1e-3) still gives the derivative to ~1e-12.
central_differences(Loss, Xs, H) ->
    [begin
         {Pre, [X | Post]} = lists:split(I - 1, Xs),
         At = fun(D) -> Loss(Pre ++ [X + D | Post]) end,
         (8 * (At(H) - At(-H)) - (At(2 * H) - At(-2 * H))) / (12 * H)
     end || I <- lists:seq(1, length(Xs))].

train_step_lowers_the_loss_test() ->
    M = fusex:model(device(), #{input => 2, seed => 3,
                               layers => [{mingru, #{hidden => 8}}, {gru, #{hidden => 8}}, {linear, #{out => 1}}]}),
    {B, L} = {4, 6},
    Xs = fusex_test_util:uniform(B * L * 2, -1.0, 1.0),
    %% The target: the running sum of the first input, a recurrence.
    Ts = lists:append([running_sum([lists:nth((Bi * L + I) * 2 + 1, Xs) || I <- lists:seq(0, L - 1)])
                       || Bi <- lists:seq(0, B - 1)]),
    X = t({f, 32}, {B, L, 2}, Xs),
    T = t({f, 32}, {B, L, 1}, Ts),
    Opt = fusex:model_optimizer(M, #{lr => 1.0e-2, weight_decay => 0.0}),
    Losses = [fusex:model_train_step(M, Opt, X, T, #{}) || _ <- lists:seq(1, 60)],
    ?assert(lists:last(Losses) < 0.5 * hd(Losses)),
    ?assertEqual(60, maps:get(step, fusex:optimizer_info(Opt))).

running_sum(Vs) -> tl(lists:reverse(lists:foldl(fun(V, [S | _] = Acc) -> [S + V | Acc] end, [0.0], Vs))).

%% The cpu and the device under test agree (where it is a GPU).
cpu_and_device_agree_test() ->
    case device() of
        cpu -> ok;
        Dev ->
            Spec = hd(specs()),
            Cpu = fusex:model(cpu, Spec),
            Gpu = fusex:model(Dev, Spec, fusex:model_weights(Cpu)),
            Xs = fusex_test_util:uniform(2 * 5 * 5, -1.0, 1.0),
            {Yc, _} = fusex:model_forward(Cpu, fusex_test_util:tensor({f, 32}, {2, 5, 5}, Xs, cpu)),
            {Yg, _} = fusex:model_forward(Gpu, fusex_test_util:tensor({f, 32}, {2, 5, 5}, Xs, Dev)),
            close(values(Yg), values(Yc), ?F32_TOL),
            Ts = fusex_test_util:uniform(2 * 5 * 3, -1.0, 1.0),
            {_, Gc} = fusex:model_gradients(Cpu, fusex_test_util:tensor({f, 32}, {2, 5, 5}, Xs, cpu),
                                            fusex_test_util:tensor({f, 32}, {2, 5, 3}, Ts, cpu), #{}),
            {_, Gg} = fusex:model_gradients(Gpu, fusex_test_util:tensor({f, 32}, {2, 5, 5}, Xs, Dev),
                                            fusex_test_util:tensor({f, 32}, {2, 5, 3}, Ts, Dev), #{}),
            [close(values(G), values(C), 1.0e-4) || {G, C} <- lists:zip(Gg, Gc)],
            ok
    end.

%% ---- bad input ----

bad(Msg, F) -> fusex_test_util:check_badarg(Msg, F).

bad_spec_test() ->
    D = device(),
    bad(<<"layers[1] (gru): hidden: expected an integer >= 1, got 0">>,
        fun() -> fusex:model(D, #{input => 4, layers => [rms_norm, {gru, #{hidden => 0}}]}) end),
    bad(<<"layers[0] (mingru): hidden: expected an integer >= 1, got none">>,
        fun() -> fusex:model(D, #{input => 4, layers => [{mingru, #{}}]}) end),
    bad({prefix, <<"layers[0]: expected {Kind, Opts} or Kind with Kind one of linear">>},
        fun() -> fusex:model(D, #{input => 4, layers => [{conv, #{}}]}) end),
    bad({prefix, <<"layers[0] (linear): ">>},
        fun() -> fusex:model(D, #{input => 4, layers => [{linear, #{out => 3, bais => true}}]}) end),
    bad(<<"layers[0] (linear): activation: expected none, relu, gelu, silu, tanh or sigmoid, got relu6">>,
        fun() -> fusex:model(D, #{input => 4, layers => [{linear, #{out => 3, activation => relu6}}]}) end),
    bad(<<"layers[0] (linear): residual: expected the layer's output width to equal its input's (4), got 3">>,
        fun() -> fusex:model(D, #{input => 4, layers => [{linear, #{out => 3, residual => true}}]}) end),
    bad(<<"layers[0] (rms_norm): eps: expected a finite number > 0, got 0">>,
        fun() -> fusex:model(D, #{input => 4, layers => [{rms_norm, #{eps => 0.0}}]}) end),
    bad(<<"input: expected an integer >= 1 (the frame's width), got none">>,
        fun() -> fusex:model(D, #{layers => [rms_norm]}) end),
    bad(<<"input: expected an integer >= 1, got 0">>,
        fun() -> fusex:model(D, #{input => 0, layers => [rms_norm]}) end),
    bad(<<"layers: expected a list of 1 to 64 layers, got []">>,
        fun() -> fusex:model(D, #{input => 2, layers => []}) end),
    bad({prefix, <<"spec: expected a map, got ">>}, fun() -> fusex:model(D, [rms_norm]) end),
    bad(<<"spec: expected only the keys input, layers, type, seed, graph, got inputs">>,
        fun() -> fusex:model(D, #{inputs => 2, layers => [rms_norm]}) end).

bad_weights_test() ->
    D = device(),
    Spec = #{input => 4, layers => [{linear, #{out => 2}}]},
    W = t({f, 32}, {2, 4}, lists:duplicate(8, 0.5)),
    Bias = t({f, 32}, {2}, [0.0, 0.0]),
    M = fusex:model(D, Spec, [#{w => W, b => Bias}]),
    {Y, _} = fusex:model_forward(M, t({f, 32}, {1, 1, 4}, [1.0, 1.0, 1.0, 1.0])),
    ?assertEqual([2.0, 2.0], values(Y)),
    #{params := 10} = fusex:model_info(M),
    bad(<<"layers[0].w: expected shape {2,4} ([out, in]), got {4,2}">>,
        fun() -> fusex:model(D, Spec, [#{w => fusex:reshape(W, {4, 2}), b => Bias}]) end),
    bad(<<"layers[0].b: expected a tensor [out], got none">>,
        fun() -> fusex:model(D, Spec, [#{w => W}]) end),
    bad(<<"layers[0].b: expected none (the layer has bias => false), got a tensor">>,
        fun() -> fusex:model(D, #{input => 4, layers => [{linear, #{out => 2, bias => false}}]},
                             [#{w => W, b => Bias}]) end),
    bad(<<"weights[0]: expected only the weights w, b, got w_z">>,
        fun() -> fusex:model(D, Spec, [#{w => W, b => Bias, w_z => W}]) end),
    bad({prefix, <<"weights[0]: expected a map, got ">>}, fun() -> fusex:model(D, Spec, [W]) end),
    bad(<<"layers[0].w: expected a binary of 32 bytes ([out, in] of the model's type), got 31">>,
        fun() -> fusex:model(D, Spec, [#{w => binary:copy(<<0>>, 31), b => Bias}]) end),
    bad(<<"layers[0].w: expected a fusex tensor or a binary, got 7">>,
        fun() -> fusex:model(D, Spec, [#{w => 7, b => Bias}]) end),
    bad(<<"weights: expected a list of 1 maps (one per layer), got []">>,
        fun() -> fusex:model(D, Spec, []) end),
    %% Binaries in the model's type work as tensors do.
    M2 = fusex:model(D, Spec, [#{w => fusex:to_binary(W), b => fusex:to_binary(Bias)}]),
    ?assertEqual([values(P) || P <- fusex:model_params(M)], [values(P) || P <- fusex:model_params(M2)]).

bad_calls_test() ->
    D = device(),
    M = fusex:model(D, #{input => 4, layers => [{gru, #{hidden => 3}}]}),
    Other = fusex:model(D, #{input => 4, layers => [{gru, #{hidden => 3}}]}),
    S = fusex:model_init_state(M, 2),
    bad(<<"batch: expected an integer >= 1, got 0">>, fun() -> fusex:model_init_state(M, 0) end),
    bad(<<"frame: expected shape {2,4} ([batch, input]: the state's batch, the model's input), got {3,4}">>,
        fun() -> fusex:model_step(M, S, t({f, 32}, {3, 4}, lists:duplicate(12, 0.0))) end),
    bad(<<"state: expected a state made by model_init_state/2 for this model, got one of another model">>,
        fun() -> fusex:model_step(Other, S, t({f, 32}, {2, 4}, lists:duplicate(8, 0.0))) end),
    bad({prefix, <<"model: expected a context saved by model/2,3, got">>},
        fun() -> fusex:model_step(S, S, t({f, 32}, {2, 4}, lists:duplicate(8, 0.0))) end),
    bad(<<"window: expected batch 2 (the state's), got 1">>,
        fun() -> fusex:model_forward(M, t({f, 32}, {1, 3, 4}, lists:duplicate(12, 0.0)), S) end),
    bad(<<"window: expected shape {1,3,4} ([batch, seqlen, input], input 4), got {1,3,5}">>,
        fun() -> fusex:model_forward(M, t({f, 32}, {1, 3, 5}, lists:duplicate(15, 0.0))) end),
    X = t({f, 32}, {1, 2, 4}, lists:duplicate(8, 0.1)),
    bad(<<"targets: expected shape {1,2,3} ([batch, seqlen, output]: the model's outputs), got {1,2,4}">>,
        fun() -> fusex:model_loss(M, X, X, #{}) end),
    bad(<<"targets: expected class indices in [0, 3), got 3 at row 1">>,
        fun() -> fusex:model_loss(M, X, t({s, 32}, {1, 2}, [0, 3]), #{loss => cross_entropy}) end),
    bad(<<"loss: expected mse or cross_entropy, got l1">>, fun() -> fusex:model_loss(M, X, X, #{loss => l1}) end),
    bad({prefix, <<"state: expected an optimizer state from adamw_init/2, sgd_init/2 or model_optimizer/2">>},
        fun() -> fusex:model_train_step(M, #{}, X, X, #{}) end).

%% A frame allocates only its output: the device's bytes come back to
%% where they were once the outputs are collected.
frames_keep_memory_test() ->
    D = device(),
    M = fusex:model(D, #{input => 3, layers => [{mingru, #{hidden => 8}}, {lstm, #{hidden => 8}}, rms_norm]}),
    S = fusex:model_init_state(M, 2),
    F = t({f, 32}, {2, 3}, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
    _ = [fusex:model_step(M, S, F) || _ <- lists:seq(1, 3)],
    Before = maps:get(allocated, fusex_test_util:settled_memory(D)),
    _ = [fusex:model_step(M, S, F) || _ <- lists:seq(1, 50)],
    ?assertEqual(Before, maps:get(allocated, fusex_test_util:settled_memory(D))),
    %% (the model and state stay referenced until here)
    {_, S} = fusex:model_step(M, S, F).

%% How a frame is enqueued: a CUDA graph per state on a GPU, plain launches
%% on the CPU or with graph => false; both give the same frames, bit for
%% bit, over a chain (the graph replays what the launches run).
frame_graph_test() ->
    D = device(),
    Spec = #{input => 4, seed => 21,
             layers => [{mamba, #{d_state => 4, residual => true}}, {gru, #{hidden => 5}}, {linear, #{out => 3}}]},
    Graph = fusex:model(D, Spec),
    Plain = fusex:model(D, Spec#{graph => false}),
    ?assertMatch(#{frame := launches, frame_why := <<"graph => false in the spec">>}, fusex:model_info(Plain)),
    case D of
        cpu -> ?assertMatch(#{frame := launches, frame_why := <<"cpu has no CUDA graphs">>},
                            fusex:model_info(Graph));
        _ -> ?assertMatch(#{frame := graph}, fusex:model_info(Graph))
    end,
    {B, L} = {2, 6},
    Xs = fusex_test_util:uniform(B * L * 4, -1.0, 1.0),
    Chain = fun(M) ->
                S = fusex:model_init_state(M, B),
                [fusex:to_binary(element(1, fusex:model_step(M, S, t({f, 32}, {B, 4}, frame_of(Xs, {B, L, 4}, T)))))
                 || T <- lists:seq(0, L - 1)]
            end,
    ?assertEqual(Chain(Plain), Chain(Graph)),
    bad(<<"graph: expected true or false, got 1">>, fun() -> fusex:model(D, Spec#{graph => 1}) end).
