%% EUnit: the stacked GRU and LSTM (fusex:gru/3, lstm/3, their backwards and
%% steps) on the device under test: the forward against a pure-Erlang f64
%% reference straight from PyTorch's equations on awkward shapes (hidden 1
%% and 37, input unlike hidden, one step, batches of 1 and 3, 1 and 3
%% layers, with and without h0 and c0), chains of steps equal to the
%% forward, every gradient against central differences of the f64 forward
%% (cpu) or the cpu backend (a GPU), the gradient map's keys, empty
%% problems, and bad input named.
-module(fusex_rnn_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, values/1, check_badarg/2]).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

types() ->
    case device() of
        cpu -> [{f, 64}, {f, 32}];
        _ -> [{f, 32}, {bf, 16}]
    end.

tol({f, 64}) -> 1.0e-12;
tol({f, 32}) -> 1.0e-5;
tol(_) -> 2.0e-2.

close(Got, Want, Tol) -> fusex_test_util:assert_close(Got, Want, Tol).

gates(gru) -> 3;
gates(lstm) -> 4.

state_type({f, 64}) -> {f, 64};
state_type(_) -> {f, 32}.

%% ---- problems: {Cell, {Batch, Seqlen, Input, Hidden, Layers}} ----

%% Random values (weights scaled as PyTorch initialises them, 1/sqrt(H)).
problem(Cell, {B, L, I, H, NL}) ->
    G = gates(Cell),
    S = 1 / math:sqrt(H),
    Layer = fun(In) -> #{w_ih => fusex_test_util:uniform(G * H * In, -S, S),
                         w_hh => fusex_test_util:uniform(G * H * H, -S, S),
                         b_ih => fusex_test_util:uniform(G * H, -S, S),
                         b_hh => fusex_test_util:uniform(G * H, -S, S)} end,
    #{x => fusex_test_util:normal(B * L * I),
      layers => [Layer(case K of 1 -> I; _ -> H end) || K <- lists:seq(1, NL)],
      h0 => fusex_test_util:uniform(NL * B * H, -0.5, 0.5),
      c0 => fusex_test_util:uniform(NL * B * H, -0.5, 0.5)}.

layer_shapes(Cell, I, H, K) ->
    G = gates(Cell),
    #{w_ih => {G * H, case K of 1 -> I; _ -> H end}, w_hh => {G * H, H}, b_ih => {G * H}, b_hh => {G * H}}.

%% The problem's tensors: x and the layers in Type, h0 and c0 f32 (any
%% float type is taken), and the values as the tensors hold them.
tensors(Cell, Type, Dims, P) -> tensors(Cell, Type, Dims, P, device()).

tensors(Cell, Type, {B, L, I, H, NL}, P, Device) ->
    T = fun(Ty, Shape, V) -> fusex_test_util:tensor(Ty, Shape, V, Device) end,
    X = T(Type, {B, L, I}, maps:get(x, P)),
    Layers = [maps:map(fun(K, V) -> T(Type, maps:get(K, layer_shapes(Cell, I, H, N)), V) end, Lp)
              || {N, Lp} <- lists:zip(lists:seq(1, NL), maps:get(layers, P))],
    H0 = T(state_type(Type), {NL, B, H}, maps:get(h0, P)),
    C0 = T(state_type(Type), {NL, B, H}, maps:get(c0, P)),
    Held = #{x => values(X), layers => [maps:map(fun(_, V) -> values(V) end, Lt) || Lt <- Layers],
             h0 => values(H0), c0 => values(C0)},
    {#{x => X, layers => Layers, h0 => H0, c0 => C0}, Held}.

chunks([], _) -> [];
chunks(List, N) -> {A, Rest} = lists:split(N, List), [A | chunks(Rest, N)].

dot(A, B) -> fusex_test_util:dot(A, B).

reference(Cell, Dims, V, With) -> fusex_test_util:rnn_reference(Cell, Dims, V, With).

%% ---- forward ----

dims() -> [{1, 5, 4, 1, 1}, {3, 4, 5, 37, 1}, {3, 3, 6, 37, 3}, {1, 1, 3, 5, 1}, {3, 6, 2, 4, 3}, {2, 4, 4, 4, 1}].

forward_matches_reference_test_() ->
    [{lists:flatten(io_lib:format("~p ~p ~p ~p", [Cell, D, Type, With])),
      {timeout, 60, fun() -> forward_case(Cell, D, Type, With) end}}
     || Cell <- [gru, lstm], D <- dims(), Type <- types(), With <- with_states(Cell)].

with_states(gru) -> [[], [h0]];
with_states(lstm) -> [[], [h0], [h0, c0], [c0]].

forward_case(Cell, Dims, Type, With) ->
    {Ts, Held} = tensors(Cell, Type, Dims, problem(Cell, Dims)),
    {WantY, WantH, WantC} = reference(Cell, Dims, Held, With),
    Opts = maps:merge(maps:with(With, Ts), #{return_state => true}),
    #{x := X, layers := Layers} = Ts,
    {B, L, _, H, NL} = Dims,
    {Y, States} = forward(Cell, X, Layers, Opts),
    ?assertEqual({B, L, H}, fusex:shape(Y)),
    ?assertEqual(Type, fusex:type(Y)),
    close(values(Y), WantY, tol(Type)),
    Hn = case {Cell, States} of
             {lstm, {Hn0, Cn}} -> close(values(Cn), WantC, tol(Type)), Hn0;
             {gru, Hn0} -> Hn0
         end,
    ?assertEqual({NL, B, H}, fusex:shape(Hn)),
    ?assertEqual(state_type(Type), fusex:type(Hn)),
    close(values(Hn), WantH, tol(Type)),
    %% without return_state: y alone, the same
    Y2 = forward(Cell, X, Layers, maps:with(With, Ts)),
    ?assertEqual(values(Y), values(Y2)).

forward(gru, X, Layers, Opts) -> fusex:gru(X, Layers, Opts);
forward(lstm, X, Layers, Opts) -> fusex:lstm(X, Layers, Opts).

%% Hand-computed: one GRU layer, hidden 1, input 1, x = 1, all weights and
%% biases 0 but w_ih = [0, 0, 1] (n's): r = z = 1/2, n = tanh(1), h = n / 2.
by_hand_test() ->
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 64}, Shape, Vs, cpu) end,
    Layer = #{w_ih => T({3, 1}, [0.0, 0.0, 1.0]), w_hh => T({3, 1}, [0.0, 0.0, 0.0]),
              b_ih => T({3}, [0.0, 0.0, 0.0]), b_hh => T({3}, [0.0, 0.0, 0.0])},
    [V] = values(fusex:gru(T({1, 1, 1}, [1.0]), [Layer], #{})),
    ?assert(abs(V - math:tanh(1.0) / 2) < 1.0e-15).

%% ---- steps ----

step_chain_test_() ->
    [{lists:flatten(io_lib:format("~p ~p ~p", [Cell, D, Type])), fun() -> step_case(Cell, D, Type) end}
     || Cell <- [gru, lstm], D <- [{1, 5, 4, 1, 1}, {3, 4, 5, 37, 3}, {3, 3, 2, 4, 1}], Type <- types()].

step_case(Cell, {B, L, I, H, NL} = Dims, Type) ->
    {Ts, Held} = tensors(Cell, Type, Dims, problem(Cell, Dims)),
    #{x := X, layers := Layers, h0 := H0, c0 := C0} = Ts,
    With = case Cell of gru -> [h0]; lstm -> [h0, c0] end,
    {Y, States} = forward(Cell, X, Layers, maps:merge(maps:with(With, Ts), #{return_state => true})),
    Hs = fusex:copy(H0, device()),
    Cs = fusex:copy(C0, device()),
    Frames = [fusex_test_util:tensor(Type, {B, I}, F, device()) || F <- frames(maps:get(x, Held), B, L, I)],
    Ys = [case Cell of
              gru -> {Yt, Hs} = fusex:gru_step(Hs, Xt, Layers), values(Yt);
              lstm -> {Yt, {Hs, Cs}} = fusex:lstm_step({Hs, Cs}, Xt, Layers), values(Yt)
          end || Xt <- Frames],
    ?assertEqual({B, H}, {B, length(hd(Ys)) div max(B, 1)}),
    %% frame-major back to [batch, seqlen, hidden]
    Steps = lists:append([lists:append([lists:nth(B0, chunks(Yt, H)) || Yt <- Ys]) || B0 <- lists:seq(1, B)]),
    close(Steps, values(Y), tol(Type)),
    case States of
        {Hn, Cn} -> close(values(Hs), values(Hn), tol(Type)), close(values(Cs), values(Cn), tol(Type));
        Hn -> close(values(Hs), values(Hn), tol(Type))
    end,
    ?assertEqual({NL, B, H}, fusex:shape(Hs)).

%% x [batch, seqlen, input] as seqlen frames [batch, input].
frames(X, B, L, I) ->
    Rows = chunks(X, L * I),
    [lists:append([lists:sublist(R, (T - 1) * I + 1, I) || R <- Rows]) || T <- lists:seq(1, L), B > 0].

%% ---- backward ----

%% The loss sum(y .* Ry) + sum(h_n .* Rh) (+ sum(c_n .* Rc)) and every
%% gradient of it: the backward against central differences of the f64
%% forward at a few coordinates of every input (cpu), or against the cpu
%% backend (a GPU).
backward_test_() ->
    [{lists:flatten(io_lib:format("~p ~p ~p", [Cell, D, With])),
      {timeout, 120, fun() -> backward_case(Cell, D, With) end}}
     || Cell <- [gru, lstm], D <- [{2, 3, 3, 4, 2}, {1, 2, 2, 1, 1}, {3, 2, 4, 5, 3}, {1, 1, 3, 37, 1}],
        With <- with_states(Cell)].

backward_case(Cell, {B, L, _I, H, NL} = Dims, With) ->
    P = problem(Cell, Dims),
    Ry = fusex_test_util:normal(B * L * H),
    Rh = fusex_test_util:normal(NL * B * H),
    Rc = fusex_test_util:normal(NL * B * H),
    Type = case device() of cpu -> {f, 64}; _ -> {f, 32} end,
    Grads = gradients(Cell, device(), Type, Dims, P, With, Ry, Rh, Rc),
    ?assertEqual(lists:sort([x, layers | With]), lists:sort(maps:keys(Grads))),
    ?assertEqual(NL, length(maps:get(layers, Grads))),
    [?assertEqual([b_hh, b_ih, w_hh, w_ih], lists:sort(maps:keys(G))) || G <- maps:get(layers, Grads)],
    case device() of
        cpu -> central_differences(Cell, Dims, P, With, Ry, Rh, Rc, Grads);
        _ ->
            Want = gradients(Cell, cpu, {f, 64}, Dims, P, With, Ry, Rh, Rc),
            compare_grads(Grads, Want, 1.0e-4)
    end.

%% Every gradient as value lists: #{x, h0, c0, layers => [#{w_ih, ...}]}.
gradients(Cell, Device, Type, Dims, P, With, Ry, Rh, Rc) ->
    {B, L, _, H, NL} = Dims,
    {Ts, _} = tensors(Cell, Type, Dims, P, Device),
    T = fun(Ty, Shape, V) -> fusex_test_util:tensor(Ty, Shape, V, Device) end,
    Opts = maps:merge(maps:with(With, Ts), #{return_state => true, save_for_backward => true}),
    #{x := X, layers := Layers} = Ts,
    Dy = T(Type, {B, L, H}, Ry),
    Dh = T(state_type(Type), {NL, B, H}, Rh),
    Dc = T(state_type(Type), {NL, B, H}, Rc),
    G = case Cell of
            gru -> {_, _, Ctx} = fusex:gru(X, Layers, Opts), fusex:gru_backward(Dy, Ctx, #{dh_n => Dh});
            lstm -> {_, _, Ctx} = fusex:lstm(X, Layers, Opts),
                    fusex:lstm_backward(Dy, Ctx, #{dh_n => Dh, dc_n => Dc})
        end,
    maps:map(fun(layers, Ls) -> [maps:map(fun(_, V) -> values(V) end, Lg) || Lg <- Ls];
                (_, V) -> values(V)
             end, G).

compare_grads(Got, Want, Tol) ->
    maps:foreach(fun(layers, Ls) ->
                         [compare_grads(G, W, Tol) || {G, W} <- lists:zip(Ls, maps:get(layers, Want))];
                    (K, V) -> ?assertEqual({K, ok}, {K, close(V, maps:get(K, Want), Tol)})
                 end, Got).

%% The loss of the f64 forward on the cpu for the values of P.
loss(Cell, {B, L, I, H, NL}, P, With, Ry, Rh, Rc) ->
    T = fun(Shape, V) -> fusex_test_util:tensor({f, 64}, Shape, V, cpu) end,
    Layers = [maps:map(fun(K, V) -> T(maps:get(K, layer_shapes(Cell, I, H, N)), V) end, Lp)
              || {N, Lp} <- lists:zip(lists:seq(1, NL), maps:get(layers, P))],
    Opts = maps:from_list([{K, T({NL, B, H}, maps:get(K, P))} || K <- With]),
    X = T({B, L, I}, maps:get(x, P)),
    case Cell of
        gru -> {Y, Hn} = fusex:gru(X, Layers, Opts#{return_state => true}),
               dot(values(Y), Ry) + dot(values(Hn), Rh);
        lstm -> {Y, {Hn, Cn}} = fusex:lstm(X, Layers, Opts#{return_state => true}),
                dot(values(Y), Ry) + dot(values(Hn), Rh) + dot(values(Cn), Rc)
    end.

%% At three coordinates of every input (the first, the last, one at
%% random), (loss(v + e) - loss(v - e)) / 2e against the backward's.
central_differences(Cell, Dims, P, With, Ry, Rh, Rc, Grads) ->
    Loss = fun(Q) -> loss(Cell, Dims, Q, With, Ry, Rh, Rc) end,
    Paths = [[x] | [[K] || K <- With]] ++
        [[layers, N, K] || N <- lists:seq(1, length(maps:get(layers, P))), K <- [w_ih, w_hh, b_ih, b_hh]],
    [fd_at(Loss, P, Grads, Path) || Path <- Paths].

fd_at(Loss, P, Grads, Path) ->
    Values = get_in(P, Path),
    N = length(Values),
    Want = get_in(Grads, Path),
    [begin
         E = 1.0e-6,
         Plus = Loss(set_in(P, Path, bump(Values, K, E))),
         Minus = Loss(set_in(P, Path, bump(Values, K, -E))),
         Fd = (Plus - Minus) / (2 * E),
         Got = lists:nth(K, Want),
         ?assert(is_float(Got)),
         ?assertEqual({Path, K, true}, {Path, K, abs(Got - Fd) =< 1.0e-6 * max(1.0, abs(Fd))})
     end || K <- lists:usort([1, N, rand:uniform(N)])].

bump(Values, K, E) ->
    {A, [V | Rest]} = lists:split(K - 1, Values),
    A ++ [V + E | Rest].

get_in(M, [layers, N, K]) -> maps:get(K, lists:nth(N, maps:get(layers, M)));
get_in(M, [K]) -> maps:get(K, M).

set_in(M, [layers, N, K], V) ->
    Ls = maps:get(layers, M),
    {A, [L | Rest]} = lists:split(N - 1, Ls),
    M#{layers => A ++ [L#{K => V} | Rest]};
set_in(M, [K], V) -> M#{K => V}.

%% ---- empty problems ----

empty_test_() ->
    [{lists:flatten(io_lib:format("~p ~p", [Cell, D])), fun() -> empty_case(Cell, D) end}
     || Cell <- [gru, lstm], D <- [{2, 0, 3, 4, 2}, {0, 3, 3, 4, 1}]].

empty_case(Cell, {B, L, _, H, NL} = Dims) ->
    {Ts, Held} = tensors(Cell, {f, 32}, Dims, problem(Cell, Dims)),
    #{x := X, layers := Layers, h0 := H0} = Ts,
    {Y, States} = forward(Cell, X, Layers, #{h0 => H0, return_state => true}),
    ?assertEqual({B, L, H}, fusex:shape(Y)),
    Hn = case States of {Hn0, _} -> Hn0; Hn0 -> Hn0 end,
    ?assertEqual({NL, B, H}, fusex:shape(Hn)),
    %% no step: the final state is the initial one
    close(values(Hn), maps:get(h0, Held), 0.0).

%% ---- bad input ----

bad_input_test_() ->
    Dims = {2, 3, 5, 4, 2},
    {Ts, _} = tensors(gru, {f, 32}, Dims, problem(gru, Dims)),
    {Lt, _} = tensors(lstm, {f, 32}, Dims, problem(lstm, Dims)),
    #{x := X, layers := [L0, L1], h0 := H0} = Ts,
    T = fun(Type, Shape) -> fusex:zeros(Type, Shape, #{device => device()}) end,
    [?_test(check_badarg(<<"layers[1].w_hh: expected shape {12,4} ([3*hidden, hidden]), got {12,5}">>,
                         fun() -> fusex:gru(X, [L0, L1#{w_hh => T({f, 32}, {12, 5})}], #{}) end)),
     ?_test(check_badarg(<<"layers[0].w_ih: expected shape {12,5} ([3*hidden, input]), got {12,4}">>,
                         fun() -> fusex:gru(X, [L0#{w_ih => T({f, 32}, {12, 4})}], #{}) end)),
     ?_test(check_badarg({prefix, <<"layers[1].b_ih: expected a tensor">>},
                         fun() -> fusex:gru(X, [L0, maps:remove(b_ih, L1)], #{}) end)),
     ?_test(check_badarg({prefix, <<"layers[0]: expected only the keys #{w_ih, w_hh, b_ih, b_hh}, got ">>},
                         fun() -> fusex:gru(X, [L0#{bias => X}], #{}) end)),
     ?_test(check_badarg({prefix, <<"layers[0]: expected a map #{w_ih, w_hh, b_ih, b_hh}, got ">>},
                         fun() -> fusex:gru(X, [X], #{}) end)),
     ?_test(check_badarg({prefix, <<"layers: expected a list of 1 to 14 maps #{w_ih, w_hh, b_ih, b_hh}, got ">>},
                         fun() -> fusex:gru(X, [], #{}) end)),
     ?_test(check_badarg({prefix, <<"layers: expected a list of 1 to 14 maps">>},
                         fun() -> fusex:gru(X, L0, #{}) end)),
     ?_test(check_badarg({prefix, <<"layers: expected a list of 1 to 14 maps">>},
                         fun() -> fusex:gru(X, lists:duplicate(15, L0), #{}) end)),
     ?_test(check_badarg(<<"layers[0].w_hh: expected type {f,32}, got {f,64}">>,
                         fun() -> fusex:gru(X, [L0#{w_hh => T({f, 64}, {12, 4})}], #{}) end)),
     ?_test(check_badarg({prefix, <<"x: expected rank 3">>},
                         fun() -> fusex:gru(T({f, 32}, {2, 5}), [L0], #{}) end)),
     ?_test(check_badarg({prefix, <<"h0: expected shape {2,2,4}">>},
                         fun() -> fusex:gru(X, [L0, L1], #{h0 => T({f, 32}, {1, 2, 4})}) end)),
     ?_test(check_badarg({prefix, <<"opts: ">>}, fun() -> fusex:gru(X, [L0, L1], #{c0 => H0}) end)),
     ?_test(check_badarg({prefix, <<"layers[0].w_ih: expected shape {16,5} ([4*hidden, input])">>},
                         fun() -> fusex:lstm(X, [L0], #{}) end)),
     ?_test(check_badarg({prefix, <<"h: expected ">>},
                         fun() -> fusex:gru_step(T({f, 64}, {2, 2, 4}), T({f, 32}, {2, 5}), [L0, L1]) end)),
     ?_test(check_badarg({prefix, <<"h: expected shape {2,2,4}">>},
                         fun() -> fusex:gru_step(T({f, 32}, {1, 2, 4}), T({f, 32}, {2, 5}), [L0, L1]) end)),
     ?_test(check_badarg({prefix, <<"x: expected rank 2">>},
                         fun() -> fusex:gru_step(T({f, 32}, {2, 2, 4}), X, [L0, L1]) end)),
     ?_test(check_badarg({prefix, <<"state: expected a tuple {H, C} of two tensors, got ">>},
                         fun() -> fusex:lstm_step(H0, T({f, 32}, {2, 5}), maps:get(layers, Lt)) end)),
     ?_test(check_badarg({prefix, <<"c: expected shape {2,2,4}">>},
                         fun() -> fusex:lstm_step({H0, T({f, 32}, {2, 4})}, T({f, 32}, {2, 5}),
                                                  maps:get(layers, Lt)) end)),
     ?_test(check_badarg({prefix, <<"ctx: expected a context saved by fusex:gru">>},
                         fun() -> fusex:gru_backward(X, make_ref()) end)),
     ?_test(check_badarg({prefix, <<"dy: expected shape {2,3,4}">>},
                         fun() -> {_, Ctx} = fusex:gru(X, [L0, L1], #{save_for_backward => true}),
                                  fusex:gru_backward(X, Ctx) end)),
     ?_test(check_badarg({prefix, <<"ctx: expected a context saved by fusex:lstm">>},
                         fun() -> {_, Ctx} = fusex:gru(X, [L0, L1], #{save_for_backward => true}),
                                  fusex:lstm_backward(T({f, 32}, {2, 3, 4}), Ctx) end))].

%% ---- the descriptions ----

op_list_test() ->
    Ops = [D || #{family := rnn} = D <- fusex:op_list()],
    ?assertEqual([gru_fwd, gru_bwd, gru_step, lstm_fwd, lstm_bwd, lstm_step], [N || #{name := N} <- Ops]),
    [#{inputs := Inputs, attrs := [#{name := layers, role := repeat} | _]} | _] = Ops,
    ?assertEqual([{x, false}, {h0, false}, {w_ih, true}, {w_hh, true}, {b_ih, true}, {b_hh, true}],
                 [{N, R} || #{name := N, repeated := R} <- Inputs]).

op_check_test() ->
    S = fun(Shape) -> {{f, 32}, Shape} end,
    Layer = fun(In) -> #{w_ih => S({12, In}), w_hh => S({12, 4}), b_ih => S({12}), b_hh => S({12})} end,
    ?assertEqual(#{y => S({2, 3, 4}), h_n => S({3, 2, 4})},
                 fusex:op_check(gru_fwd, #{x => S({2, 3, 5}), layers => [Layer(5), Layer(4), Layer(4)]},
                                #{return_state => true}, cpu)),
    ?assertMatch(#{dx := _, layers := [#{dw_ih := {{f, 32}, {12, 5}}}, #{dw_ih := {{f, 32}, {12, 4}}}]},
                 fusex:op_check(gru_bwd, #{x => S({2, 3, 5}), saved => S({2, 2, 3, 20}), dy => S({2, 3, 4}),
                                           layers => [Layer(5), Layer(4)]}, #{}, cpu)),
    ?assertEqual({badarg, <<"layers[1].w_ih: expected shape {12,4} ([3*hidden, hidden]), got {12,5}">>},
                 fusex:op_check(gru_fwd, #{x => S({2, 3, 5}), layers => [Layer(5), Layer(5)]}, #{}, cpu)).
