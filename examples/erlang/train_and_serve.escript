#!/usr/bin/env escript
%% Trains a small recurrent model (two linear layers into a MinGRU, a
%% linear head) with fusex's ops, their backwards and fusex's fused AdamW,
%% then serves it frame by frame with fusex:mingru_step/3 on a resident
%% state updated in place, and checks the served frames against the model
%% on the whole sequence.
%%
%%   make example-erl     (after make all: the beams in _build/default)
%%! -noshell
-define(B, 8).
-define(L, 16).
-define(F, 2).
-define(H, 8).

main(_) ->
    Root = filename:dirname(filename:dirname(filename:dirname(filename:absname(escript:script_name())))),
    true = code:add_patha(filename:join([Root, "_build", "default", "lib", "fusex", "ebin"])),
    rand:seed(exsss, 7),
    X = [[[rand:uniform() * 2 - 1 || _ <- lists:seq(1, ?F)] || _ <- lists:seq(1, ?L)] || _ <- lists:seq(1, ?B)],
    Y = [target(Seq) || Seq <- X],
    Xt = t({?B, ?L, ?F}, lists:flatten(X)),
    Yt = t({?B, ?L, 1}, lists:flatten(Y)),
    Params = [t({?H, ?F}, normal(?H * ?F)), t({?H, ?F}, normal(?H * ?F)), t({1, ?H}, normal(?H)), t({1}, [0.0])],
    Opt = fusex:adamw_init(Params, #{lr => 2.0e-2, weight_decay => 0.0}),
    Losses = [train_step(Opt, Params, Xt, Yt) || _ <- lists:seq(1, 60)],
    io:format("training loss: ~.4f -> ~.4f (60 AdamW steps)~n", [hd(Losses), lists:last(Losses)]),
    Whole = values(predict(Params, Xt)),
    Served = serve(Params, X),
    Diff = lists:max([abs(A - B) || {A, B} <- lists:zip(Whole, Served)]),
    io:format("served frame by frame vs the whole sequence: max |diff| = ~g~n", [Diff]),
    case lists:last(Losses) < 0.5 * hd(Losses) andalso Diff =< 1.0e-5 of
        true -> io:format("ok~n");
        false -> io:format("FAILED~n"), halt(1)
    end.

%% y_t = 0.7 y_{t-1} + x_t[0] / 2
target(Seq) ->
    {Ys, _} = lists:mapfoldl(fun([X0 | _], Acc) -> V = 0.7 * Acc + X0 / 2, {[V], V} end, 0.0, Seq),
    Ys.

predict([Wz, Wc, Wo, Bo], X) ->
    H = fusex:mingru(fusex:linear(X, Wz), fusex:linear(X, Wc)),
    fusex:linear(H, Wo, #{bias => Bo}).

%% One step: forwards saving their contexts, the loss's gradient, the
%% backwards in reverse, one fused AdamW step over every parameter.
train_step(Opt, [Wz, Wc, Wo, Bo] = Params, X, Y) ->
    {Z, CtxZ} = fusex:linear(X, Wz, #{save_for_backward => true}),
    {C, CtxC} = fusex:linear(X, Wc, #{save_for_backward => true}),
    {H, CtxH} = fusex:mingru(Z, C, #{save_for_backward => true}),
    {P, CtxP} = fusex:linear(H, Wo, #{bias => Bo, save_for_backward => true}),
    Err = fusex:subtract(P, Y),
    Loss = lists:sum([E * E || E <- values(Err)]) / (?B * ?L),
    Dp = fusex:scale(Err, 2.0 / (?B * ?L)),
    #{x := Dh, w := DWo, bias := DBo} = fusex:linear_backward(Dp, CtxP),
    #{z_logits := Dz, cand := Dc} = fusex:mingru_backward(Dh, CtxH),
    #{w := DWz} = fusex:linear_backward(Dz, CtxZ),
    #{w := DWc} = fusex:linear_backward(Dc, CtxC),
    fusex:adamw_step(Opt, Params, [DWz, DWc, DWo, DBo], #{}),
    Loss.

%% Frame by frame: the state a resident tensor, updated in place.
serve([Wz, Wc, Wo, Bo], X) ->
    State = fusex:zeros({f, 32}, {?B, ?H}, #{device => cpu}),
    Frames = [begin
                  Xt = t({?B, ?F}, lists:flatten([lists:nth(T, Seq) || Seq <- X])),
                  H = fusex:mingru_step(State, fusex:linear(Xt, Wz), fusex:linear(Xt, Wc)),
                  values(fusex:linear(H, Wo, #{bias => Bo}))
              end || T <- lists:seq(1, ?L)],
    %% frames are [batch] each: back to [batch, seqlen]
    [lists:nth(B, F) || B <- lists:seq(1, ?B), F <- Frames].

t(Shape, Values) -> fusex:tensor(<< <<V:32/float-native>> || V <- Values >>, {f, 32}, Shape, #{device => cpu}).

values(T) -> [V || <<V:32/float-native>> <= fusex:to_binary(T)].

normal(N) -> [rand:normal() * 0.5 || _ <- lists:seq(1, N)].
