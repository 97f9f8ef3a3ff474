%% @doc `make demo': trains two small recurrent policies (a 2-layer GRU and
%% two Mamba blocks) on the default device with fusex alone (no Nx, no
%% XLA) and plays them frame by frame.
%%
%% The task has a known answer: each frame shows one of `?SYMBOLS' symbols
%% (one-hot); the policy must answer, at frame t, the symbol it saw at
%% frame t - `?DELAY' (the blank class 0 for the first frames). Each model
%% trains with cross-entropy and fused AdamW on fresh random sequences
%% (fusex:model_train_step/5), printing the loss every `?EVERY' steps; then
%% plays held-out sequences one frame per fusex:model_step/3 at batch 1,
%% reading each answer back as a policy would, and reports the accuracy
%% (frames past the delay) and the latency of a frame as the caller sees it
%% (step + the read of its output) against a 60 Hz frame's 16.7 ms.
%%
%% Ends with one line per model:
%% `demo: MODEL trained on DEVICE: loss FIRST -> LAST in STEPS steps;
%% held-out accuracy VALUE; frame p50 X us p99 Y us'.
%%
%% The op-by-op table that `make demo' printed before is `make selftest'
%% (fusex_selftest); compare/3, values/1, rel_l2/2 and time_us/2 stay here
%% for the families' rows that call them.
-module(fusex_demo).

-export([main/0, run/0, compare/3, values/1, rel_l2/2, time_us/2]).

-define(SYMBOLS, 4).
-define(DELAY, 3).
-define(SEQLEN, 16).
-define(BATCH, 32).
-define(EVERY, 25).
-define(HELD_OUT, 40).
-define(BUDGET_US, 16700).

%% @private
main() ->
    try run() of
        ok -> halt(0)
    catch
        C:R:S ->
            io:format(standard_error, "demo failed: ~p:~p~n~p~n", [C, R, S]),
            halt(1)
    end.

%% @doc Trains and plays both models on the default device.
-spec run() -> ok.
run() ->
    Seed = erlang:system_time() rem 1000000007,
    rand:seed(exsss, Seed),
    Device = fusex:default_device(),
    io:format("fusex demo on ~s (seed ~b): recall the symbol seen ~b frames ago, ~b symbols, "
              "sequences of ~b frames, batch ~b~n", [label(Device), Seed, ?DELAY, ?SYMBOLS, ?SEQLEN, ?BATCH]),
    %% A 2-layer GRU, and two Mamba blocks (d_model 16, d_inner 32,
    %% d_state 8) behind an input projection, with their residuals.
    Models = [{"gru-2x32", 200, [{gru, #{hidden => 32}}, {gru, #{hidden => 32}}]},
              {"mamba-2x16", 100, [{linear, #{out => 16}},
                                   {mamba, #{d_state => 8, expand => 2, residual => true}},
                                   {mamba, #{d_state => 8, expand => 2, residual => true}}]}],
    Lines = [demo_model(Device, Name, Steps, Layers) || {Name, Steps, Layers} <- Models],
    io:format("~n"),
    [io:format("~s~n", [L]) || L <- Lines],
    ok.

label(cpu) -> "cpu";
label({cuda, N}) -> io_lib:format("cuda:~b", [N]).

demo_model(Device, Name, Steps, Layers) ->
    Spec = #{input => ?SYMBOLS + 1, seed => rand:uniform(1 bsl 30),
             layers => Layers ++ [{linear, #{out => ?SYMBOLS + 1}}]},
    Model = fusex:model(Device, Spec),
    #{params := Params} = fusex:model_info(Model),
    io:format("~n~s: ~b parameters~n", [Name, Params]),
    Opt = fusex:model_optimizer(Model, #{lr => 1.0e-2, weight_decay => 0.0}),
    T0 = erlang:monotonic_time(millisecond),
    Losses = [train_step(Device, Model, Opt, Step) || Step <- lists:seq(1, Steps)],
    TrainMs = erlang:monotonic_time(millisecond) - T0,
    io:format("  trained in ~.1f s~n", [TrainMs / 1000]),
    {Accuracy, Us} = play(Device, Model),
    P50 = percentile(Us, 0.50),
    P99 = percentile(Us, 0.99),
    io:format("  held out: ~b sequences, ~b frames, accuracy ~.4f; frame p50 ~.1f us, p99 ~.1f us "
              "(budget ~b us: ~s)~n",
              [?HELD_OUT, length(Us), Accuracy, P50, P99, ?BUDGET_US,
               if P99 =< ?BUDGET_US -> "within"; true -> "OVER" end]),
    io_lib:format("demo: ~s trained on ~s: loss ~.6f -> ~.6f in ~b steps; held-out accuracy ~.4f; "
                  "frame p50 ~.1f us p99 ~.1f us",
                  [Name, label(Device), hd(Losses), lists:last(Losses), Steps, Accuracy, P50, P99]).

train_step(Device, Model, Opt, Step) ->
    Seqs = [sequence() || _ <- lists:seq(1, ?BATCH)],
    Inputs = fusex:tensor(inputs(Seqs), {f, 32}, {?BATCH, ?SEQLEN, ?SYMBOLS + 1}, #{device => Device}),
    Targets = fusex:tensor(<< <<L:32/signed-native>> || S <- Seqs, L <- labels(S) >>, {s, 32},
                           {?BATCH, ?SEQLEN}, #{device => Device}),
    Loss = fusex:model_train_step(Model, Opt, Inputs, Targets, #{loss => cross_entropy}),
    case Step rem ?EVERY of
        0 -> io:format("  step ~4b: loss ~.4f~n", [Step, Loss]);
        _ when Step =:= 1 -> io:format("  step ~4b: loss ~.4f~n", [Step, Loss]);
        _ -> ok
    end,
    Loss.

%% Symbols 1..?SYMBOLS (0 is the blank answer of the first frames).
sequence() -> [rand:uniform(?SYMBOLS) || _ <- lists:seq(1, ?SEQLEN)].

labels(Seq) -> lists:duplicate(?DELAY, 0) ++ lists:sublist(Seq, ?SEQLEN - ?DELAY).

one_hot(S) -> << <<(if I =:= S -> 1.0; true -> 0.0 end):32/float-native>> || I <- lists:seq(0, ?SYMBOLS) >>.

inputs(Seqs) -> << <<(one_hot(S))/binary>> || Seq <- Seqs, S <- Seq >>.

%% Plays the held-out sequences one frame at a time at batch 1: returns the
%% accuracy past the delay and every frame's microseconds.
play(Device, Model) ->
    State = fusex:model_init_state(Model, 1),
    Results = [play_sequence(Device, Model, State, sequence()) || _ <- lists:seq(1, ?HELD_OUT)],
    Hits = lists:append([H || {H, _} <- Results]),
    Us = lists:append([U || {_, U} <- Results]),
    {lists:sum(Hits) / length(Hits), Us}.

play_sequence(Device, Model, State, Seq) ->
    ok = fusex:model_reset_state(Model, State),
    Frames = [fusex:tensor(one_hot(S), {f, 32}, {1, ?SYMBOLS + 1}, #{device => Device}) || S <- Seq],
    Answers = [begin
                   T0 = erlang:monotonic_time(nanosecond),
                   {Out, State} = fusex:model_step(Model, State, F),
                   Logits = fusex:to_binary(Out),
                   {argmax(Logits), (erlang:monotonic_time(nanosecond) - T0) / 1000}
               end || F <- Frames],
    Hits = [if A =:= L -> 1; true -> 0 end
            || {{A, _}, L, T} <- lists:zip3(Answers, labels(Seq), lists:seq(1, ?SEQLEN)), T > ?DELAY],
    {Hits, [U || {_, U} <- Answers]}.

argmax(Bin) ->
    Vs = [V || <<V:32/float-native>> <= Bin],
    {_, I} = lists:max(lists:zip(Vs, lists:seq(0, length(Vs) - 1))),
    I.

percentile(Us, P) ->
    Sorted = lists:sort(Us),
    lists:nth(max(1, min(length(Sorted), round(P * length(Sorted)))), Sorted).

%% ---- kept for the families' selftest rows (fusex_selftest) ----

%% @doc See fusex_selftest:compare/3.
-spec compare(fusex:tensor(), fusex:tensor() | [number()], fusex:type()) -> float() | infinity.
compare(Got, Want, Type) -> fusex_selftest:compare(Got, Want, Type).

%% @doc See fusex_selftest:values/1.
-spec values(fusex:tensor()) -> [float() | atom()].
values(T) -> fusex_selftest:values(T).

%% @doc See fusex_selftest:rel_l2/2.
-spec rel_l2([float() | atom()], [float() | atom()]) -> float() | infinity.
rel_l2(G, W) -> fusex_selftest:rel_l2(G, W).

%% @doc See fusex_selftest:time_us/2.
-spec time_us(fun(() -> term()), pos_integer()) -> float().
time_us(Fun, Reps) -> fusex_selftest:time_us(Fun, Reps).
