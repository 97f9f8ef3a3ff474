%% @doc Shared by the Erlang suites: the device under test, seeded random
%% data, encoding values of every type, rel-L2 comparison, and the f64
%% references of the selective scan and the linear recurrences.
-module(fusex_test_util).

-export([check_badarg/2, settled_memory/1, device/0, seed/0, uniform/3, normal/1, encode/2, decode/2, tensor/3, tensor/4,
         values/1, rel_l2/2, assert_close/3, poisoned/2, poisoned/3,
         ssm_reference/3, linrec_reference/4, sig/1, softplus/1, cand/2,
         conv_reference/3, norm_reference/4, rnn_reference/4, linear_reference/3, act/2, central_differences/2, dot/2]).

%% The device the suites run on: the default device (FUSEX_DEVICE), which
%% must be CUDA when FUSEX_REQUIRE_CUDA=1 (make test-gpu).
device() ->
    Device = fusex:default_device(),
    case {os:getenv("FUSEX_REQUIRE_CUDA"), Device} of
        {"1", cpu} -> error({cuda_required, fusex:devices()});
        _ -> Device
    end.

%% Seeds this process's generator from FUSEX_SEED or the clock and prints
%% the seed, so a failing run can be replayed.
seed() ->
    Seed = case os:getenv("FUSEX_SEED") of
               false -> erlang:unique_integer([positive]) bxor erlang:system_time();
               S -> list_to_integer(S)
           end,
    rand:seed(exsss, Seed),
    io:format(user, "~n  FUSEX_SEED=~b~n", [Seed]),
    Seed.

uniform(N, Lo, Hi) -> [Lo + (Hi - Lo) * rand:uniform_real() || _ <- lists:seq(1, N)].

normal(N) -> [rand:normal() || _ <- lists:seq(1, N)].

encode(Type, Values) -> << <<(enc(Type, V))/binary>> || V <- Values >>.

enc({f, 32}, V) -> <<V:32/float-native>>;
enc({f, 64}, V) -> <<V:64/float-native>>;
enc({f, 16}, V) -> <<V:16/float-native>>;
enc({bf, 16}, V) ->
    <<Bits:32/native>> = <<V:32/float-native>>,
    Rounded = (Bits + 16#7FFF + ((Bits bsr 16) band 1)) bsr 16,
    <<Rounded:16/native>>;
enc({s, 32}, V) -> <<V:32/signed-native>>;
enc({s, 64}, V) -> <<V:64/signed-native>>;
enc({u, 8}, V) -> <<V:8>>.

decode({f, 32}, Bin) -> [float_or_nan(B, 32) || <<B:4/binary>> <= Bin];
decode({f, 64}, Bin) -> [float_or_nan(B, 64) || <<B:8/binary>> <= Bin];
decode({f, 16}, Bin) -> [float_or_nan(B, 16) || <<B:2/binary>> <= Bin];
decode({bf, 16}, Bin) -> [bf16(B) || <<B:16/native>> <= Bin];
decode({s, 32}, Bin) -> [V || <<V:32/signed-native>> <= Bin];
decode({s, 64}, Bin) -> [V || <<V:64/signed-native>> <= Bin];
decode({u, 8}, Bin) -> binary_to_list(Bin).

%% Erlang floats have no NaN or infinity: those decode to atoms, which
%% never compare close to a number.
float_or_nan(B, 16) -> case B of <<V:16/float-native>> -> V; _ -> nan end;
float_or_nan(B, 32) -> case B of <<V:32/float-native>> -> V; _ -> nan end;
float_or_nan(B, 64) -> case B of <<V:64/float-native>> -> V; _ -> nan end.

tensor(Type, Shape, Values) -> tensor(Type, Shape, Values, device()).
tensor(Type, Shape, Values, Device) ->
    fusex:tensor(encode(Type, Values), Type, Shape, #{device => Device}).

values(T) -> decode(fusex:type(T), fusex:to_binary(T)).

bf16(Bits) -> case <<Bits:16, 0:16>> of <<V:32/float-big>> -> V; _ -> nan end.

%% A tensor whose every byte is 0xFF (NaN for floats).
poisoned(Type, Shape) -> poisoned(Type, Shape, device()).
poisoned(Type, Shape, Device) ->
    {_, Bits} = Type,
    N = lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)),
    fusex:tensor(binary:copy(<<255>>, N * Bits div 8), Type, Shape, #{device => Device}).

%% ||Got - Want|| / ||Want||; anything not a number makes it infinity.
rel_l2(Got, Want) when length(Got) =:= length(Want) ->
    case lists:all(fun is_number/1, Got ++ Want) of
        false -> infinity;
        true ->
            Diff = lists:sum([(G - W) * (G - W) || {G, W} <- lists:zip(Got, Want)]),
            Ref = lists:sum([W * W || W <- Want]),
            if
                Ref == 0, Diff == 0 -> 0.0;
                Ref == 0 -> infinity;
                true -> math:sqrt(Diff / Ref)
            end
    end.

assert_close(Got, Want, Tol) ->
    case rel_l2(Got, Want) of
        Err when is_float(Err), Err =< Tol -> ok;
        Err -> error({not_close, #{rel_l2 => Err, tolerance => Tol}})
    end.

%% The device's memory counters once no destructor is pending: garbage
%% collect, then read until two readings 10 ms apart agree (tensors of
%% exited processes are destroyed asynchronously).
settled_memory(Device) -> settled_memory(Device, fusex:memory(Device), 100).

settled_memory(_Device, Last, 0) -> Last;
settled_memory(Device, Last, Tries) ->
    erlang:garbage_collect(),
    ok = fusex:synchronize(Device),
    timer:sleep(10),
    case fusex:memory(Device) of
        Now when Now =:= Last -> Now;
        Now -> settled_memory(Device, Now, Tries - 1)
    end.

%% Runs F, which must raise {badarg, Msg}; `Expected' is the whole message,
%% or {prefix, Start} where the rest varies (a reference, a driver reason).
check_badarg(Expected, F) ->
    try F() of
        Result -> error({expected_badarg, Expected, got_result, Result})
    catch
        error:{badarg, Msg} when is_binary(Msg) ->
            case badarg_matches(Expected, Msg) of
                true -> ok;
                false -> error({wrong_message, Msg, expected, Expected})
            end
    end.

badarg_matches({prefix, Prefix}, Msg) ->
    binary:longest_common_prefix([Msg, Prefix]) =:= byte_size(Prefix);
badarg_matches(Whole, Msg) ->
    Whole =:= Msg.

%% ---- references, straight from the equations ----

%% The selective scan (include/fusex_ssm.h) of dims {Batch, Seqlen, Dim,
%% Dstate, Groups}: {Ys, FinalState} as flat lists. Values holds the flat
%% lists x, dt, a, b, c and, for the options in Opts (of d, z, dt_bias, h0,
%% dt_softplus), d, z, dt_bias and h0.
ssm_reference({Bt, L, D, N, G}, Values, Opts) ->
    Has = fun(K) -> lists:member(K, Opts) end,
    Tup = maps:map(fun(_, V) when is_list(V) -> list_to_tuple(V); (_, V) -> V end, Values),
    At = fun(K, I) -> element(I + 1, maps:get(K, Tup)) end,
    Opt = fun(K, I, Default) -> case Has(K) of true -> At(K, I); false -> Default end end,
    Cpg = case G of 0 -> 1; _ -> max(1, D div G) end,
    Channel =
        fun(B, Ch) ->
                H0 = [Opt(h0, (B * D + Ch) * N + K, 0.0) || K <- lists:seq(0, N - 1)],
                lists:mapfoldl(
                  fun(T, H) ->
                          I = (B * L + T) * D + Ch,
                          Row = ((B * L + T) * G + Ch div Cpg) * N,
                          U = At(dt, I) + Opt(dt_bias, Ch, 0.0),
                          Delta = case Has(dt_softplus) of
                                      true when U > 20 -> U;
                                      true -> math:log(1 + math:exp(U));
                                      false -> U
                                  end,
                          X = At(x, I),
                          H1 = [math:exp(Delta * At(a, Ch * N + K)) * Hk + Delta * At(b, Row + K) * X
                                || {K, Hk} <- lists:zip(lists:seq(0, N - 1), H)],
                          Y0 = lists:sum([At(c, Row + K) * Hk
                                          || {K, Hk} <- lists:zip(lists:seq(0, N - 1), H1)])
                               + Opt(d, Ch, 0.0) * X,
                          Y = case Has(z) of
                                  true -> Z = At(z, I), Y0 * Z / (1 + math:exp(-Z));
                                  false -> Y0
                              end,
                          {Y, H1}
                  end, H0, lists:seq(0, L - 1))
        end,
    Runs = maps:from_list([{{B, Ch}, Channel(B, Ch)}
                           || B <- lists:seq(0, Bt - 1), Ch <- lists:seq(0, D - 1)]),
    Ys = [lists:nth(T + 1, element(1, maps:get({B, Ch}, Runs)))
          || B <- lists:seq(0, Bt - 1), T <- lists:seq(0, L - 1), Ch <- lists:seq(0, D - 1)],
    State = lists:append([element(2, maps:get({B, Ch}, Runs))
                          || B <- lists:seq(0, Bt - 1), Ch <- lists:seq(0, D - 1)]),
    {Ys, State}.

%% The linear recurrences (docs/LINREC.md), h[t] = a[t] * h[t-1] + b[t] with
%% each op's (a, b), over dims {Batch, Seqlen, Hidden}: {Hs, FinalState} as
%% flat lists. Values holds seq (the flat lists of the op's sequence inputs,
%% in argument order), for liquid tau and a, and the values of the tensors
%% that Opts names. Opts is the op's options map: reverse,
%% candidate_activation, h0 (any value: Values' h0, Batch * Hidden of them)
%% and dt (a number, or tensor: Values' dt_list, Batch * Seqlen of them).
linrec_reference(Op, {B, L, H}, Values, Opts) ->
    Seq = [list_to_tuple(S) || S <- maps:get(seq, Values)],
    Rows = case maps:get(reverse, Opts, false) of
               true -> lists:seq(L - 1, 0, -1);
               false -> lists:seq(0, L - 1)
           end,
    G = maps:get(candidate_activation, Opts, identity) =:= g,
    H0 = case maps:is_key(h0, Opts) of
             true -> list_to_tuple(maps:get(h0, Values));
             false -> erlang:make_tuple(B * H, 0.0)
         end,
    Param = fun(K) -> list_to_tuple(maps:get(K, Values, [])) end,
    {Tau, A, DtList} = {Param(tau), Param(a), Param(dt_list)},
    Dt = fun(Bi, Row) ->
                 case maps:get(dt, Opts, 1.0) of
                     tensor -> element(Bi * L + Row + 1, DtList);
                     V -> V
                 end
         end,
    Coeff = fun(Xs, Bi, Hi, Row) ->
                    case {Op, Xs} of
                        {linear_scan, [Ca, Cb]} -> {Ca, Cb};
                        {mingru, [Z, C]} -> S = sig(Z), {1 - S, S * cand(G, C)};
                        {minlstm, [F, I, C]} ->
                            D = softplus(-I) - softplus(-F),
                            {sig(D), sig(-D) * cand(G, C)};
                        {liquid, [F]} ->
                            S = sig(F), Dv = Dt(Bi, Row),
                            Den = 1 + Dv * (1 / element(Hi + 1, Tau) + S),
                            {1 / Den, Dv * S * element(Hi + 1, A) / Den}
                    end
            end,
    Channel = fun(Bi, Hi) ->
                      lists:mapfoldl(
                        fun(Row, Hv) ->
                                Xs = [element((Bi * L + Row) * H + Hi + 1, S) || S <- Seq],
                                {Ca, Cb} = Coeff(Xs, Bi, Hi, Row),
                                New = Ca * Hv + Cb,
                                {{Row, New}, New}
                        end, element(Bi * H + Hi + 1, H0), Rows)
              end,
    Runs = maps:from_list([{{Bi, Hi}, Channel(Bi, Hi)} || Bi <- lists:seq(0, B - 1), Hi <- lists:seq(0, H - 1)]),
    Hs = [proplists:get_value(Row, element(1, maps:get({Bi, Hi}, Runs)))
          || Bi <- lists:seq(0, B - 1), Row <- lists:seq(0, L - 1), Hi <- lists:seq(0, H - 1)],
    State = [element(2, maps:get({Bi, Hi}, Runs)) || Bi <- lists:seq(0, B - 1), Hi <- lists:seq(0, H - 1)],
    {Hs, State}.

%% The gates of the linear recurrences (docs/LINREC.md): the sigmoid and
%% softplus in forms that do not overflow, and the candidate activation
%% (g when its flag is true).
sig(X) when X >= 0 -> 1 / (1 + math:exp(-X));
sig(X) -> E = math:exp(X), E / (1 + E).

softplus(X) -> max(X, 0.0) + math:log(1 + math:exp(-abs(X))).

cand(true, X) when X >= 0 -> X + 0.5;
cand(true, X) -> sig(X);
cand(false, X) -> X.

%% The causal depthwise convolution (include/fusex_conv.h) over dims {B, L,
%% D, W}: {Y, FinalState} as flat lists ([B, L, D] and [B, D, W - 1]).
%% Values holds the flat lists x, w and, where given, bias and
%% initial_state; Act is none or silu.
conv_reference({B, L, D, W}, Values, Act) ->
    X = list_to_tuple(maps:get(x, Values)),
    Wt = list_to_tuple(maps:get(w, Values)),
    Bias = fun(Di) -> case Values of #{bias := Bs} -> lists:nth(Di + 1, Bs); _ -> 0.0 end end,
    Init = case Values of #{initial_state := I} -> list_to_tuple(I); _ -> none end,
    %% x_t[d] of sequence Bi, the initial state's before the first step
    In = fun(Bi, T, Di) when T >= 0 -> element((Bi * L + T) * D + Di + 1, X);
            (_, _, _) when Init =:= none -> 0.0;
            (Bi, T, Di) -> element((Bi * D + Di) * (W - 1) + (W - 1 + T) + 1, Init)
         end,
    Y = [act(Act, Bias(Di) + lists:sum([element(Di * W + K + 1, Wt) * In(Bi, T - (W - 1) + K, Di)
                                        || K <- lists:seq(0, W - 1)]))
         || Bi <- lists:seq(0, B - 1), T <- lists:seq(0, L - 1), Di <- lists:seq(0, D - 1)],
    Final = [In(Bi, L - (W - 1) + J, Di)
             || Bi <- lists:seq(0, B - 1), Di <- lists:seq(0, D - 1), J <- lists:seq(0, W - 2)],
    {Y, Final}.

%% rms_norm or layer_norm (include/fusex_norm.h) over {Rows, Hidden}: {Y,
%% S} as flat lists (S = x + residual; the atom none without a residual).
%% Values holds x and weight and, where given, bias, residual and gate.
norm_reference(Kind, {Rows, H}, Values, Eps) ->
    Row = fun(K, R) -> lists:sublist(maps:get(K, Values), R * H + 1, H) end,
    Has = fun(K) -> maps:is_key(K, Values) end,
    Weight = maps:get(weight, Values),
    Bias = maps:get(bias, Values, lists:duplicate(H, 0.0)),
    Rs = [begin
              X = Row(x, R),
              S = case Has(residual) of true -> [A + B || {A, B} <- lists:zip(X, Row(residual, R))]; false -> X end,
              Mu = case Kind of layer_norm -> lists:sum(S) / H; rms_norm -> 0.0 end,
              Rstd = 1 / math:sqrt(lists:sum([(V - Mu) * (V - Mu) || V <- S]) / H + Eps),
              O = [(V - Mu) * Rstd * Wv + Bv || {V, Wv, Bv} <- lists:zip3(S, Weight, Bias)],
              Y = case Has(gate) of true -> [Ov * act(silu, G) || {Ov, G} <- lists:zip(O, Row(gate, R))]; false -> O end,
              {Y, S}
          end || R <- lists:seq(0, Rows - 1)],
    Ys = lists:append([Y || {Y, _} <- Rs]),
    case Has(residual) of
        true -> {Ys, lists:append([S || {_, S} <- Rs])};
        false -> {Ys, none}
    end.

%% A linear layer (include/fusex_linear.h) over {Rows, In, Out}: y =
%% act(x W^T + bias), flat [Rows, Out]. Values holds x, w and, where
%% given, bias.
linear_reference({Rows, In, Out}, Values, Act) ->
    X = list_to_tuple(maps:get(x, Values)),
    Wt = list_to_tuple(maps:get(w, Values)),
    Bias = list_to_tuple(maps:get(bias, Values, lists:duplicate(Out, 0.0))),
    [act(Act, element(O + 1, Bias) + lists:sum([element(R * In + K + 1, X) * element(O * In + K + 1, Wt)
                                                 || K <- lists:seq(0, In - 1)]))
     || R <- lists:seq(0, Rows - 1), O <- lists:seq(0, Out - 1)].

%% The activations (include/fusex_activation.h; gelu in its tanh form).
act(none, U) -> U;
act(relu, U) -> max(U, 0.0);
act(gelu, U) -> 0.5 * U * (1 + math:tanh(math:sqrt(2 / math:pi()) * (U + 0.044715 * U * U * U)));
act(silu, U) -> U * sig(U);
act(tanh, U) -> math:tanh(U);
act(sigmoid, U) -> sig(U).

%% d Loss / d Xs[i] for every i by central differences (step 1e-5), where
%% Loss(Xs') is a number.
central_differences(Loss, Xs) ->
    N = length(Xs),
    [begin
         {Pre, [X | Post]} = lists:split(I - 1, Xs),
         (Loss(Pre ++ [X + 1.0e-5 | Post]) - Loss(Pre ++ [X - 1.0e-5 | Post])) / 2.0e-5
     end || I <- lists:seq(1, N)].

dot(Xs, Ys) -> lists:sum([X * Y || {X, Y} <- lists:zip(Xs, Ys)]).

rnn_gates(gru) -> 3;
rnn_gates(lstm) -> 4.

rnn_chunks([], _) -> [];
rnn_chunks(List, N) -> {A, Rest} = lists:split(N, List), [A | rnn_chunks(Rest, N)].

rnn_matvec(Rows, V) -> [dot(Row, V) || Row <- Rows].
rnn_add(A, B) -> lists:zipwith(fun erlang:'+'/2, A, B).

rnn_cell(gru, {Wi, Wh, Bi, Bh}, X, H, C) ->
    Hd = length(H),
    [Axr, Axz, Axn] = rnn_chunks(rnn_add(rnn_matvec(Wi, X), Bi), Hd),
    [Ahr, Ahz, Ahn] = rnn_chunks(rnn_add(rnn_matvec(Wh, H), Bh), Hd),
    R = [sig(A + B) || {A, B} <- lists:zip(Axr, Ahr)],
    Z = [sig(A + B) || {A, B} <- lists:zip(Axz, Ahz)],
    N = [math:tanh(A + Rr * B) || {A, Rr, B} <- lists:zip3(Axn, R, Ahn)],
    {[(1 - Zz) * Nn + Zz * Hh || {Zz, Nn, Hh} <- lists:zip3(Z, N, H)], C};
rnn_cell(lstm, {Wi, Wh, Bi, Bh}, X, H, C) ->
    Hd = length(H),
    [Gi, Gf, Gg, Go] = rnn_chunks(rnn_add(rnn_add(rnn_matvec(Wi, X), Bi), rnn_add(rnn_matvec(Wh, H), Bh)), Hd),
    C2 = [sig(F) * Cc + sig(I) * math:tanh(G) || {F, Cc, {I, G}} <- lists:zip3(Gf, C, lists:zip(Gi, Gg))],
    {[sig(O) * math:tanh(Cc) || {O, Cc} <- lists:zip(Go, C2)], C2}.

rnn_seq(Cell, P, Seq, H, C) ->
    {Out, Hn, Cn} = lists:foldl(fun(Xt, {Acc, Ht, Ct}) ->
                                        {H2, C2} = rnn_cell(Cell, P, Xt, Ht, Ct),
                                        {[H2 | Acc], H2, C2}
                                end, {[], H, C}, Seq),
    {lists:reverse(Out), Hn, Cn}.

%% The stacked GRU or LSTM (include/fusex_rnn.h: PyTorch's nn.GRU and
%% nn.LSTM) of dims {Batch, Seqlen, Input, Hidden, Layers}: {Y, Hn, Cn} as flat lists ([batch, seqlen, hidden], [layers, batch,
%% hidden]) from the values of a problem; h0, c0 zeros unless in `With'.
rnn_reference(_Cell, {0, _, _, _, _}, _V, _With) -> {[], [], []};
rnn_reference(Cell, {B, L, I, H, NL}, V, With) ->
    Zero = lists:duplicate(NL * B * H, 0.0),
    H0 = case lists:member(h0, With) of true -> maps:get(h0, V); false -> Zero end,
    C0 = case lists:member(c0, With) of true -> maps:get(c0, V); false -> Zero end,
    PerLayer = fun(S) -> [rnn_chunks(Sl, H) || Sl <- rnn_chunks(S, B * H)] end,
    Seqs0 = case L of
                0 -> lists:duplicate(B, []);
                _ -> [rnn_chunks(Xb, I) || Xb <- rnn_chunks(maps:get(x, V), L * I)]
            end,
    Params = [{rnn_chunks(Wi, length(Wi) div (rnn_gates(Cell) * H)), rnn_chunks(Wh, H), Bi, Bh}
              || #{w_ih := Wi, w_hh := Wh, b_ih := Bi, b_hh := Bh} <- maps:get(layers, V)],
    {Seqs, Hs, Cs} = lists:foldl(
                       fun({P, Hl, Cl}, {In, AccH, AccC}) ->
                               Res = [rnn_seq(Cell, P, Seq, Hb, Cb) || {Seq, Hb, Cb} <- lists:zip3(In, Hl, Cl)],
                               {[O || {O, _, _} <- Res], [[Hn || {_, Hn, _} <- Res] | AccH],
                                [[Cn || {_, _, Cn} <- Res] | AccC]}
                       end, {Seqs0, [], []}, lists:zip3(Params, PerLayer(H0), PerLayer(C0))),
    {lists:append(lists:append(Seqs)), lists:append(lists:append(lists:reverse(Hs))),
     lists:append(lists:append(lists:reverse(Cs)))}.

