%% EUnit: the linear-recurrence API (linear_scan, mingru, minlstm, liquid,
%% their backward and step) on the device under test: each op against a
%% pure-Erlang reference, reverse = flipped input, split with carried state
%% and step-by-step = one call, the options and their results, gradients
%% (finite differences on cpu, the cpu backend on a GPU), the gradient map
%% keys, and every kind of bad input with its message.
-module(fusex_linrec_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, values/1]).

-define(OPS, [linear_scan, mingru, minlstm, liquid]).

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

%% ---- inputs and the reference ----

types() ->
    case device() of
        cpu -> [{f, 32}, {f, 64}, {bf, 16}];
        _ -> [{f, 32}, {bf, 16}, {f, 16}]
    end.

tol({f, 64}) -> 1.0e-12;
tol({f, 32}) -> 1.0e-5;
tol(_) -> 1.0e-2.

state_type({f, 64}) -> {f, 64};
state_type(_) -> {f, 32}.

nseq(linear_scan) -> 2;
nseq(mingru) -> 2;
nseq(minlstm) -> 3;
nseq(liquid) -> 1.

%% Random inputs for Op as lists: #{seq => [List], tau, a, dt}.
inputs(Op, {B, L, H}) ->
    N = B * L * H,
    Seq = [seq_values(Op, K, N) || K <- lists:seq(1, nseq(Op))],
    Base = #{seq => Seq},
    case Op of
        liquid -> Base#{tau => fusex_test_util:uniform(H, 0.5, 3.0),
                        a => fusex_test_util:uniform(H, -2.0, 2.0),
                        dt_list => fusex_test_util:uniform(B * L, 0.05, 1.0)};
        _ -> Base
    end.

seq_values(linear_scan, 1, N) -> fusex_test_util:uniform(N, 0.8, 1.0);
seq_values(linear_scan, 2, N) -> fusex_test_util:uniform(N, -1.0, 1.0);
seq_values(mingru, 2, N) -> fusex_test_util:uniform(N, -2.0, 2.0);
seq_values(minlstm, 3, N) -> fusex_test_util:uniform(N, -2.0, 2.0);
seq_values(_, _, N) -> [2 * X || X <- fusex_test_util:normal(N)].

%% Tensors for the inputs on Device; returns {Args, Inputs as the tensors
%% hold them (rounded to Type)}.
tensors(Op, Type, {B, L, H} = Dims, In, Device) ->
    T = fun(Shape, Vs) -> fusex_test_util:tensor(Type, Shape, Vs, Device) end,
    Seq = [T(Dims, S) || S <- maps:get(seq, In)],
    Params = case Op of
                 liquid -> [T({H}, maps:get(tau, In)), T({H}, maps:get(a, In))];
                 _ -> []
             end,
    Args = Seq ++ Params,
    Held = #{seq => [values(S) || S <- Seq]},
    Held1 = case Op of
                liquid -> [Tau, A] = Params,
                          Held#{tau => values(Tau), a => values(A),
                                dt_list => values(T({B, L, 1}, maps:get(dt_list, In)))};
                _ -> Held
            end,
    {Args, Held1}.

call(Op, Args, Opts) -> apply(fusex, Op, Args ++ [Opts]).

close(Got, Want, Tol) -> fusex_test_util:assert_close(Got, Want, Tol).

%% ---- forward against the reference ----

forward_matches_reference_test_() ->
    Dims = {2, 7, 5},
    [{lists:flatten(io_lib:format("~p ~p ~p", [Op, Type, Variant])),
      fun() -> forward_case(Op, Type, Dims, Variant) end}
     || Op <- ?OPS, Type <- types(), Variant <- [plain, h0_reverse, extra]].

forward_case(Op, Type, {B, _L, H} = Dims, Variant) ->
    Device = device(),
    In = inputs(Op, Dims),
    {Args, Held} = tensors(Op, Type, Dims, In, Device),
    H0 = fusex_test_util:uniform(B * H, -1.0, 1.0),
    %% the call's options, the reference's (its tensors by name) and the
    %% values of those tensors
    {Opts, RefOpts, Values} =
        case Variant of
            plain -> {#{}, #{}, Held};
            h0_reverse ->
                H0t = fusex_test_util:tensor(state_type(Type), {B, H}, H0, Device),
                {#{h0 => H0t, reverse => true}, #{h0 => h0, reverse => true}, Held#{h0 => values(H0t)}};
            extra when Op =:= liquid ->
                DtT = fusex_test_util:tensor(Type, {B, element(2, Dims), 1},
                                             maps:get(dt_list, In), Device),
                {#{dt => DtT}, #{dt => tensor}, Held};
            extra when Op =:= linear_scan -> {#{reverse => true}, #{reverse => true}, Held};
            extra -> {#{candidate_activation => g}, #{candidate_activation => g}, Held}
        end,
    {Hs, State} = call(Op, Args, Opts#{return_state => true}),
    {WantH, WantState} = fusex_test_util:linrec_reference(Op, Dims, Values, RefOpts),
    close(values(Hs), WantH, tol(Type)),
    ?assertEqual(state_type(Type), fusex:type(State)),
    close(values(State), WantState, tol(Type)),
    case Op of
        liquid -> %% a scalar dt
            {Hs2, _} = call(Op, Args, Opts#{return_state => true, dt => 0.25}),
            {WantH2, _} = fusex_test_util:linrec_reference(Op, Dims, Values, RefOpts#{dt => 0.25}),
            close(values(Hs2), WantH2, tol(Type));
        _ -> ok
    end.

%% Hand-computed: h = [2,1] through (a, b) = ([.5,2],[1,0]), ([.5,-1],[1,1]),
%% ([2,0],[0,3]) gives [2,2], [2,-1], [4,3].
linear_scan_by_hand_test() ->
    T = fun(Shape, Vs) -> fusex_test_util:tensor({f, 32}, Shape, Vs) end,
    A = T({1, 3, 2}, [0.5, 2.0, 0.5, -1.0, 2.0, 0.0]),
    B = T({1, 3, 2}, [1.0, 0.0, 1.0, 1.0, 0.0, 3.0]),
    {H, S} = fusex:linear_scan(A, B, #{h0 => T({1, 2}, [2.0, 1.0]), return_state => true}),
    ?assertEqual([2.0, 2.0, 2.0, -1.0, 4.0, 3.0], values(H)),
    ?assertEqual([4.0, 3.0], values(S)).

%% ---- identities ----

flip(List, {B, L, W}) ->
    Rows = [lists:sublist(List, (R * W) + 1, W) || R <- lists:seq(0, B * L - 1)],
    PerBatch = [lists:sublist(Rows, Bi * L + 1, L) || Bi <- lists:seq(0, B - 1)],
    lists:append(lists:append([lists:reverse(P) || P <- PerBatch])).

reverse_is_flipped_scan_test_() ->
    [{atom_to_list(Op), fun() -> reverse_case(Op) end} || Op <- ?OPS].

reverse_case(Op) ->
    Device = device(),
    Type = {f, 32},
    {B, L, H} = Dims = {2, 9, 3},
    In = inputs(Op, Dims),
    Flipped = In#{seq => [flip(S, Dims) || S <- maps:get(seq, In)]},
    {Args, _} = tensors(Op, Type, Dims, In, Device),
    {FArgs, _} = tensors(Op, Type, Dims, Flipped, Device),
    {Hr, Sr} = call(Op, Args, #{reverse => true, return_state => true}),
    {Hf, Sf} = call(Op, FArgs, #{return_state => true}),
    close(values(Hr), flip(values(Hf), {B, L, H}), 1.0e-6),
    close(values(Sr), values(Sf), 1.0e-6).

split_with_carried_state_test_() ->
    [{lists:flatten(io_lib:format("~p ~p", [Op, Type])), fun() -> split_case(Op, Type) end}
     || Op <- ?OPS, Type <- types()].

slice(List, {B, L, W}, From, Len) ->
    lists:append([lists:sublist(List, (Bi * L + From) * W + 1, Len * W) || Bi <- lists:seq(0, B - 1)]).

split_case(Op, Type) ->
    Device = device(),
    {B, L, H} = Dims = {2, 11, 4},
    Cut = 4,
    In = inputs(Op, Dims),
    Part = fun(From, Len) ->
                   Sliced = In#{seq => [slice(S, Dims, From, Len) || S <- maps:get(seq, In)]},
                   case In of
                       #{dt_list := Dt} -> Sliced#{dt_list => slice(Dt, {B, L, 1}, From, Len)};
                       _ -> Sliced
                   end
           end,
    {Args, _} = tensors(Op, Type, Dims, In, Device),
    {Args1, _} = tensors(Op, Type, {B, Cut, H}, Part(0, Cut), Device),
    {Args2, _} = tensors(Op, Type, {B, L - Cut, H}, Part(Cut, L - Cut), Device),
    {Hw, Sw} = call(Op, Args, #{return_state => true}),
    {H1, S1} = call(Op, Args1, #{return_state => true}),
    {H2, S2} = call(Op, Args2, #{h0 => S1, return_state => true}),
    Joined = lists:append([lists:sublist(values(H1), Bi * Cut * H + 1, Cut * H) ++
                               lists:sublist(values(H2), Bi * (L - Cut) * H + 1, (L - Cut) * H)
                           || Bi <- lists:seq(0, B - 1)]),
    close(Joined, values(Hw), tol(Type)),
    close(values(S2), values(Sw), tol(Type)).

steps_are_one_call_test_() ->
    [{lists:flatten(io_lib:format("~p ~p", [Op, Type])), fun() -> steps_case(Op, Type) end}
     || Op <- ?OPS, Type <- types()].

steps_case(Op, Type) ->
    Device = device(),
    {B, L, H} = Dims = {3, 5, 4},
    In = inputs(Op, Dims),
    {Args, _} = tensors(Op, Type, Dims, In, Device),
    Opts = case Op of
               liquid -> #{dt => 0.5};
               mingru -> #{candidate_activation => g};
               _ -> #{}
           end,
    {Hw, Sw} = call(Op, Args, Opts#{return_state => true}),
    State = fusex:zeros(state_type(Type), {B, H}, #{device => Device}),
    Frames = [begin
                  FrameIn = [slice(S, Dims, T, 1) || S <- maps:get(seq, In)],
                  Seq = [fusex_test_util:tensor(Type, {B, H}, F, Device) || F <- FrameIn],
                  Params = lists:nthtail(nseq(Op), Args),
                  Hs = apply(fusex, list_to_atom(atom_to_list(Op) ++ "_step"),
                             [State | Seq ++ Params] ++ [Opts]),
                  ?assertEqual({B, H}, fusex:shape(Hs)),
                  ?assertEqual(Type, fusex:type(Hs)),
                  %% the state now holds the new h (in f32)
                  close(values(Hs), values(State), tol(Type)),
                  values(Hs)
              end || T <- lists:seq(0, L - 1)],
    Stepped = lists:append([lists:append([lists:sublist(F, Bi * H + 1, H) || F <- Frames])
                            || Bi <- lists:seq(0, B - 1)]),
    close(Stepped, values(Hw), tol(Type)),
    close(values(State), values(Sw), tol(Type)).

liquid_step_with_dt_tensor_test() ->
    Device = device(),
    {B, H} = {2, 3},
    In = inputs(liquid, {B, 1, H}),
    {Args, _} = tensors(liquid, {f, 32}, {B, 1, H}, In, Device),
    DtVals = [0.3, 0.7],
    {Hw, _} = call(liquid, Args, #{dt => fusex_test_util:tensor({f, 32}, {B, 1, 1}, DtVals, Device),
                                   return_state => true}),
    [F, Tau, A] = Args,
    State = fusex:zeros({f, 32}, {B, H}, #{device => Device}),
    Hs = fusex:liquid_step(State, fusex:reshape(F, {B, H}), Tau, A,
                           #{dt => fusex_test_util:tensor({f, 32}, {B, 1}, DtVals, Device)}),
    close(values(Hs), values(Hw), 1.0e-6).

%% ---- options and results ----

result_shapes_test() ->
    Device = device(),
    Dims = {2, 3, 4},
    {Args, _} = tensors(mingru, {bf, 16}, Dims, inputs(mingru, Dims), Device),
    H = call(mingru, Args, #{}),
    ?assert(is_reference(H)),
    ?assertEqual({2, 3, 4}, fusex:shape(H)),
    ?assertEqual({bf, 16}, fusex:type(H)),
    {H1, S1} = call(mingru, Args, #{return_state => true}),
    ?assertEqual({2, 4}, fusex:shape(S1)),
    ?assertEqual({f, 32}, fusex:type(S1)),
    ?assertEqual(values(H), values(H1)),
    {_, Ctx} = call(mingru, Args, #{save_for_backward => true}),
    ?assert(is_reference(Ctx)),
    {_, _, Ctx2} = call(mingru, Args, #{save_for_backward => true, return_state => true}),
    ?assert(is_map(fusex:mingru_backward(H, Ctx2))),
    ?assertEqual(Device, fusex:device(H)).

empty_sequence_test() ->
    Device = device(),
    {Args, _} = tensors(mingru, {f, 32}, {2, 0, 3}, inputs(mingru, {2, 0, 3}), Device),
    H0 = fusex_test_util:tensor({f, 32}, {2, 3}, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], Device),
    {H, S, Ctx} = call(mingru, Args, #{h0 => H0, return_state => true, save_for_backward => true}),
    ?assertEqual({2, 0, 3}, fusex:shape(H)),
    ?assertEqual([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], values(S)),
    DState = fusex_test_util:tensor({f, 32}, {2, 3}, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0], Device),
    #{h0 := Dh0, z_logits := Dz} = fusex:mingru_backward(H, Ctx, #{dstate => DState}),
    ?assertEqual([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], values(Dh0)),
    ?assertEqual({2, 0, 3}, fusex:shape(Dz)).

%% ---- gradients ----

gradient_keys_test_() ->
    [{lists:flatten(io_lib:format("~p h0=~p dt_tensor=~p", [Op, WithH0, DtTensor])),
      fun() -> keys_case(Op, WithH0, DtTensor) end}
     || Op <- ?OPS, WithH0 <- [false, true], DtTensor <- [false, true],
        DtTensor =:= false orelse Op =:= liquid].

keys_case(Op, WithH0, DtTensor) ->
    Device = device(),
    {B, L, H} = Dims = {2, 3, 4},
    Type = {f, 32},
    In = inputs(Op, Dims),
    {Args, _} = tensors(Op, Type, Dims, In, Device),
    Opts0 = case WithH0 of
                true -> #{h0 => fusex:zeros(Type, {B, H}, #{device => Device})};
                false -> #{}
            end,
    Opts = case DtTensor of
               true -> Opts0#{dt => fusex_test_util:tensor(Type, {B, L, 1}, maps:get(dt_list, In), Device)};
               false -> Opts0
           end,
    {Hs, Ctx} = call(Op, Args, Opts#{save_for_backward => true}),
    Grads = apply(fusex, list_to_atom(atom_to_list(Op) ++ "_backward"), [Hs, Ctx]),
    Inputs = lists:zip(input_names(Op), Args) ++
        [{h0, maps:get(h0, Opts)} || WithH0] ++ [{dt, maps:get(dt, Opts)} || DtTensor],
    ?assertEqual(lists:sort([K || {K, _} <- Inputs]), lists:sort(maps:keys(Grads))),
    [begin
         ?assertEqual(fusex:shape(T), fusex:shape(maps:get(K, Grads))),
         ?assertEqual(fusex:type(T), fusex:type(maps:get(K, Grads)))
     end || {K, T} <- Inputs].

input_names(linear_scan) -> [a, b];
input_names(mingru) -> [z_logits, cand];
input_names(minlstm) -> [f_logits, i_logits, cand];
input_names(liquid) -> [f_logits, tau, a].

%% The loss sum(W .* H) + sum(V .* State) and its gradients: on cpu against
%% central differences in f64, on a GPU against the cpu backend.
gradients_test_() ->
    [{lists:flatten(io_lib:format("~p reverse=~p", [Op, Rev])),
      fun() -> gradient_case(Op, Rev) end} || Op <- ?OPS, Rev <- [false, true]].

gradient_case(Op, Reverse) ->
    {B, L, H} = Dims = {2, 4, 3},
    In = inputs(Op, Dims),
    H0 = fusex_test_util:uniform(B * H, -1.0, 1.0),
    W = fusex_test_util:uniform(B * L * H, -1.0, 1.0),
    V = fusex_test_util:uniform(B * H, -1.0, 1.0),
    Extra = case Op of
                liquid -> #{dt => tensor};
                mingru -> #{candidate_activation => g};
                minlstm -> #{candidate_activation => g};
                linear_scan -> #{}
            end,
    Grads = fun(Device, Type) -> grads_on(Device, Type, Op, Dims, In, H0, W, V, Reverse, Extra) end,
    case device() of
        cpu ->
            Got = Grads(cpu, {f, 64}),
            Numeric = numeric_grads(Op, Dims, In, H0, W, V, Reverse, Extra),
            [close(maps:get(K, Got), maps:get(K, Numeric), 1.0e-6) || K <- maps:keys(Numeric)],
            ?assertEqual(lists:sort(maps:keys(Numeric)), lists:sort(maps:keys(Got)));
        Gpu ->
            Got = Grads(Gpu, {f, 32}),
            Want = Grads(cpu, {f, 32}),
            [close(maps:get(K, Got), maps:get(K, Want), 1.0e-5) || K <- maps:keys(Want)]
    end.

opts_for(Device, Type, {B, L, H}, In, H0, Reverse, Extra) ->
    Base = #{h0 => fusex_test_util:tensor(Type, {B, H}, H0, Device), reverse => Reverse,
             return_state => true},
    case Extra of
        #{dt := tensor} ->
            Base#{dt => fusex_test_util:tensor(Type, {B, L, 1}, maps:get(dt_list, In), Device)};
        _ -> maps:merge(Base, Extra)
    end.

grads_on(Device, Type, Op, Dims, In, H0, W, V, Reverse, Extra) ->
    {B, _, H} = Dims,
    {Args, _} = tensors(Op, Type, Dims, In, Device),
    Opts = opts_for(Device, Type, Dims, In, H0, Reverse, Extra),
    {_, _, Ctx} = call(Op, Args, Opts#{save_for_backward => true}),
    Dh = fusex_test_util:tensor(Type, Dims, W, Device),
    DState = fusex_test_util:tensor(state_type(Type), {B, H}, V, Device),
    G = apply(fusex, list_to_atom(atom_to_list(Op) ++ "_backward"), [Dh, Ctx, #{dstate => DState}]),
    maps:map(fun(_, T) -> values(T) end, G).

numeric_grads(Op, Dims, In, H0, W, V, Reverse, Extra) ->
    Loss = fun(In1, H01) ->
                   {Args, _} = tensors(Op, {f, 64}, Dims, In1, cpu),
                   {Hs, S} = call(Op, Args, opts_for(cpu, {f, 64}, Dims, In1, H01, Reverse, Extra)),
                   dot(values(Hs), W) + dot(values(S), V)
           end,
    Diff = fun(Get, Put) ->
                   Xs = Get(),
                   [begin
                        Up = Put(setnth(I, Xs, X + 1.0e-5)),
                        Down = Put(setnth(I, Xs, X - 1.0e-5)),
                        (Up - Down) / 2.0e-5
                    end || {I, X} <- lists:zip(lists:seq(1, length(Xs)), Xs)]
           end,
    Seq = maps:get(seq, In),
    SeqGrads = [{Name, Diff(fun() -> lists:nth(K, Seq) end,
                            fun(New) -> Loss(In#{seq => setnth(K, Seq, New)}, H0) end)}
                || {K, Name} <- lists:zip(lists:seq(1, nseq(Op)), lists:sublist(input_names(Op), nseq(Op)))],
    Params = case Op of
                 liquid -> [{P, Diff(fun() -> maps:get(P, In) end,
                                     fun(New) -> Loss(In#{P => New}, H0) end)} || P <- [tau, a]] ++
                               [{dt, Diff(fun() -> maps:get(dt_list, In) end,
                                          fun(New) -> Loss(In#{dt_list => New}, H0) end)}];
                 _ -> []
             end,
    H0Grad = {h0, Diff(fun() -> H0 end, fun(New) -> Loss(In, New) end)},
    maps:from_list(SeqGrads ++ Params ++ [H0Grad]).

dot(Xs, Ys) -> lists:sum([X * Y || {X, Y} <- lists:zip(Xs, Ys)]).

setnth(1, [_ | T], X) -> [X | T];
setnth(N, [H | T], X) -> [H | setnth(N - 1, T, X)].

%% The context holds its own references: freeing the inputs and H after
%% the forward changes nothing, and it can be used more than once.
context_outlives_its_inputs_test() ->
    Device = device(),
    Dims = {2, 5, 3},
    {Args, _} = tensors(minlstm, {f, 32}, Dims, inputs(minlstm, Dims), Device),
    Dh = fusex_test_util:tensor({f, 32}, Dims, fusex_test_util:uniform(30, -1.0, 1.0), Device),
    {H, Ctx} = call(minlstm, Args, #{save_for_backward => true}),
    First = maps:map(fun(_, T) -> values(T) end, fusex:minlstm_backward(Dh, Ctx)),
    [ok = fusex:free(T) || T <- [H | Args]],
    erlang:garbage_collect(),
    Again = maps:map(fun(_, T) -> values(T) end, fusex:minlstm_backward(Dh, Ctx)),
    ?assertEqual(First, Again).

%% ---- bad input ----

bad_input_test_() ->
    Device = device(),
    T = fun(Type, Shape) ->
                N = lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)),
                fusex_test_util:tensor(Type, Shape, [0.5 || _ <- lists:seq(1, N)], Device)
        end,
    X = T({f, 32}, {2, 3, 4}),
    Y = T({f, 32}, {2, 3, 4}),
    Wide = T({f, 32}, {2, 3, 5}),
    Ints = fusex_test_util:tensor({s, 32}, {2, 3, 4}, lists:duplicate(24, 1), Device),
    Half = T({f, 16}, {2, 3, 4}),
    Hid = T({f, 32}, {4}),
    Hid5 = T({f, 32}, {5}),
    S = T({f, 32}, {2, 4}),
    S5 = T({f, 32}, {2, 5}),
    Freed = T({f, 32}, {2, 3, 4}),
    ok = fusex:free(Freed),
    {_, ScanCtx} = fusex:linear_scan(X, Y, #{save_for_backward => true}),
    {_, GruCtx} = fusex:mingru(X, Y, #{save_for_backward => true}),
    Cases =
        [{<<"z_logits: expected a fusex tensor, got foo">>, fun() -> fusex:mingru(foo, Y) end},
         {<<"cand: expected a fusex tensor, got 1.000000e+00">>, fun() -> fusex:mingru(X, 1.0) end},
         {<<"z_logits: expected a live tensor, got one released by fusex:free/1">>,
          fun() -> fusex:mingru(Freed, Y) end},
         {float_msg(Device), fun() -> fusex:linear_scan(Ints, Y) end},
         {<<"b: expected type {f,32}, got {s,32}">>, fun() -> fusex:linear_scan(X, Ints) end},
         {<<"cand: expected type {f,32}, got {f,16}">>, fun() -> fusex:mingru(X, Half) end},
         {<<"b: expected shape {2,3,4} ([batch, seqlen, hidden], as a), got {2,3,5}">>,
          fun() -> fusex:linear_scan(X, Wide) end},
         {<<"i_logits: expected shape {2,3,4} ([batch, seqlen, hidden], as f_logits), got {2,3,5}">>,
          fun() -> fusex:minlstm(X, Wide, Y) end},
         {<<"f_logits: expected rank 3 [batch, seqlen, hidden], got rank 2 shape {2,4}">>,
          fun() -> fusex:liquid(S, Hid, Hid) end},
         {<<"tau: expected shape {4} ([hidden]), got {5}">>, fun() -> fusex:liquid(X, Hid5, Hid) end},
         {<<"a: expected shape {4} ([hidden]), got {2,4}">>, fun() -> fusex:liquid(X, Hid, S) end},
         {<<"opts: expected a map, got [reverse]">>, fun() -> fusex:mingru(X, Y, [reverse]) end},
         {<<"opts: expected only the options h0, return_state, reverse, save_for_backward, got dt">>,
          fun() -> fusex:linear_scan(X, Y, #{dt => 1.0}) end},
         {<<"opts: expected only the options h0, return_state, reverse, save_for_backward, "
            "candidate_activation, got bogus">>, fun() -> fusex:mingru(X, Y, #{bogus => 1}) end},
         {<<"opts: expected only the options h0, return_state, reverse, save_for_backward, dt, "
            "got candidate_activation">>,
          fun() -> fusex:liquid(X, Hid, Hid, #{candidate_activation => g}) end},
         {<<"candidate_activation: expected identity or g, got tanh">>,
          fun() -> fusex:minlstm(X, Y, Y, #{candidate_activation => tanh}) end},
         {<<"reverse: expected true or false, got yes">>,
          fun() -> fusex:mingru(X, Y, #{reverse => yes}) end},
         {<<"return_state: expected true or false, got 1">>,
          fun() -> fusex:mingru(X, Y, #{return_state => 1}) end},
         {<<"save_for_backward: expected true or false, got []">>,
          fun() -> fusex:mingru(X, Y, #{save_for_backward => []}) end},
         {<<"h0: expected a fusex tensor, got zeros">>, fun() -> fusex:mingru(X, Y, #{h0 => zeros}) end},
         {<<"h0: expected shape {2,4} ([batch, hidden]), got {2,5}">>,
          fun() -> fusex:mingru(X, Y, #{h0 => S5}) end},
         {<<"h0: expected type {f,32}, got {f,16}">>,
          fun() -> fusex:mingru(X, Y, #{h0 => T({f, 16}, {2, 4})}) end},
         {<<"h0: expected type {f,16} or {f,32}, got {bf,16}">>,
          fun() -> fusex:mingru(Half, Half, #{h0 => T({bf, 16}, {2, 4})}) end},
         {<<"dt: expected a positive number or a fusex tensor ([batch, seqlen, 1]), got 0">>,
          fun() -> fusex:liquid(X, Hid, Hid, #{dt => 0}) end},
         {<<"dt: expected a positive number or a fusex tensor ([batch, seqlen, 1]), got -5.000000e-01">>,
          fun() -> fusex:liquid(X, Hid, Hid, #{dt => -0.5}) end},
         {<<"dt: expected a positive number or a fusex tensor ([batch, seqlen, 1]), got fast">>,
          fun() -> fusex:liquid(X, Hid, Hid, #{dt => fast}) end},
         {<<"dt: expected shape {2,3,1} ([batch, seqlen, 1]), got {2,3,4}">>,
          fun() -> fusex:liquid(X, Hid, Hid, #{dt => Y}) end},
         {<<"dh: expected a fusex tensor, got nil">>, fun() -> fusex:mingru_backward(nil, GruCtx) end},
         {{prefix, <<"ctx: expected a context saved by fusex:mingru, got #Ref<">>},
          fun() -> fusex:mingru_backward(X, ScanCtx) end},
         {{prefix, <<"ctx: expected a context saved by fusex:liquid, got #Ref<">>},
          fun() -> fusex:liquid_backward(X, make_ref()) end},
         {<<"dh: expected shape {2,3,4} ([batch, seqlen, hidden], as the forward's output), got {2,3,5}">>,
          fun() -> fusex:mingru_backward(Wide, GruCtx) end},
         {<<"dh: expected type {f,32}, got {f,16}">>, fun() -> fusex:mingru_backward(Half, GruCtx) end},
         {<<"dstate: expected shape {2,4} ([batch, hidden]), got {2,5}">>,
          fun() -> fusex:mingru_backward(X, GruCtx, #{dstate => S5}) end},
         {<<"opts: expected only the options dstate, got h0">>,
          fun() -> fusex:linear_scan_backward(X, ScanCtx, #{h0 => S}) end},
         {<<"state: expected a fusex tensor, got undefined">>,
          fun() -> fusex:mingru_step(undefined, S, S) end},
         {<<"state: expected shape {2,4} ([batch, hidden]), got {2,5}">>,
          fun() -> fusex:mingru_step(S5, S, S) end},
         {<<"z_logits: expected rank 2 [batch, hidden], got rank 3 shape {2,3,4}">>,
          fun() -> fusex:mingru_step(S, X, X) end},
         {<<"opts: expected no options, got reverse">>,
          fun() -> fusex:linear_scan_step(S, S, S, #{reverse => true}) end},
         {<<"opts: expected only the options candidate_activation, got h0">>,
          fun() -> fusex:minlstm_step(S, S, S, S, #{h0 => S}) end},
         {<<"dt: expected shape {2,1} ([batch, 1]), got {2,4}">>,
          fun() -> fusex:liquid_step(S, S, Hid, Hid, #{dt => S}) end},
         {<<"dt: expected a positive number or a fusex tensor ([batch, 1]), got -1">>,
          fun() -> fusex:liquid_step(S, S, Hid, Hid, #{dt => -1}) end}]
        ++ gpu_only_cases(Device, X, Y),
    [{lists:flatten(io_lib:format("~p", [Expected])),
      fun() -> fusex_test_util:check_badarg(Expected, F) end} || {Expected, F} <- Cases].

float_msg(cpu) -> <<"a: expected a float type ({f,32}, {bf,16}, {f,16} or {f,64}), got {s,32}">>;
float_msg(_) -> <<"a: expected a float type ({f,32}, {bf,16}, {f,16}), got {s,32}">>.

gpu_only_cases(cpu, _, _) -> [];
gpu_only_cases(_Gpu, X, Y) ->
    OnCpu = fusex:copy(Y, cpu),
    F64 = fusex:copy(fusex:convert(OnCpu, {f, 64}), device()),
    [{<<"cand: expected a tensor on cuda:0 (where z_logits is), got one on cpu">>,
      fun() -> fusex:mingru(X, OnCpu) end},
     {<<"a: expected type {f,32}, {bf,16} or {f,16} on cuda:0 ({f,64} runs on cpu only), got {f,64}">>,
      fun() -> fusex:linear_scan(F64, F64) end}].

