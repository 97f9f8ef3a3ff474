%% @private
%% @doc Bench cases for resident models (docs/MODELS.md): one frame of a
%% 2-layer Mamba (d_model 256, d_state 16, expand 2; each layer an RMSNorm
%% then a Mamba block with its residual) at batch 1 and 32, as the state's
%% CUDA graph and as plain launches, the same frame with its output read
%% back (what an agent does with it), a 2-layer GRU H512 frame, a 32-frame
%% window, and a training step of a 2-layer Mamba d768 B8 L2048 on CUDA.
%% The e2e column is the time a frame takes as the Erlang caller sees it:
%% `model_step' plus `fusex:synchronize/1' (or the read-back), the issue's
%% targets; the kernel column is the device's time from the frame's first
%% enqueue to its last. Peers: bench/peers_model.py in the same call.
-module(fusex_bench_model).

-export([cases/1]).

-define(F32, {f, 32}).

cases(Device) ->
    Mamba = mamba_layers(256),
    Gru = [{gru, #{hidden => 512}}, {gru, #{hidden => 512}}],
    [frame("2-layer Mamba d256 N16", Mamba, 256, 1, true, Device, #{e2e_target_us => 20}),
     frame("2-layer Mamba d256 N16", Mamba, 256, 1, false, Device, #{}),
     read_frame("2-layer Mamba d256 N16", Mamba, 256, 1, Device),
     frame("2-layer Mamba d256 N16", Mamba, 256, 32, true, Device, #{e2e_target_us => 30}),
     frame("2-layer GRU H512", Gru, 512, 1, true, Device, #{e2e_target_us => 18}),
     frame("2-layer GRU H512", Gru, 512, 1, false, Device, #{}),
     window("2-layer Mamba d256 N16", Mamba, 256, 32, Device, #{e2e_target_us => 40})]
    ++ [train_step(Device) || Device =/= cpu].

mamba_layers(_DModel) ->
    Block = [rms_norm, {mamba, #{d_state => 16, expand => 2, d_conv => 4, residual => true}}],
    Block ++ Block.

model(Device, Layers, Input, Graph) ->
    fusex:model(Device, #{input => Input, layers => Layers, seed => 1, graph => Graph}).

frames(Batch, Input, Device) ->
    list_to_tuple([fusex_bench:uniform(?F32, {Batch, Input}, -1.0, 1.0, Device) || _ <- lists:seq(1, 8)]).

how(true) -> "graph";
how(false) -> "launches".

frame(Name, Layers, Input, Batch, Graph, Device, Extra) ->
    maps:merge(#{op => iolist_to_binary(["model_step, ", how(Graph)]),
                 shape => iolist_to_binary(io_lib:format("~s B~b (one frame)", [Name, Batch])),
                 dtype => ?F32, bytes => 0, reps => 1000,
                 setup => fun() -> setup(Device, Layers, Input, Batch, Graph) end,
                 run => fun({M, S, Frames}, I) ->
                                {Out, S} = fusex:model_step(M, S, element(I rem 8 + 1, Frames)),
                                Out
                        end,
                 teardown => fun teardown/1}, Extra).

%% The frame's output copied to the host: model_step then to_binary, the
%% caller's view of an action.
read_frame(Name, Layers, Input, Batch, Device) ->
    #{op => <<"model_step, graph, output read back">>,
      shape => iolist_to_binary(io_lib:format("~s B~b (one frame)", [Name, Batch])),
      dtype => ?F32, bytes => 0, reps => 1000, kernel => false, sync => false,
      setup => fun() -> setup(Device, Layers, Input, Batch, true) end,
      run => fun({M, S, Frames}, I) ->
                     {Out, S} = fusex:model_step(M, S, element(I rem 8 + 1, Frames)),
                     _ = fusex:to_binary(Out),
                     Out
             end,
      teardown => fun teardown/1}.

setup(Device, Layers, Input, Batch, Graph) ->
    M = model(Device, Layers, Input, Graph),
    {M, fusex:model_init_state(M, Batch), frames(Batch, Input, Device)}.

teardown({_M, _S, Frames}) ->
    [fusex:free(F) || F <- tuple_to_list(Frames)],
    ok.

window(Name, Layers, Input, SeqLen, Device, Extra) ->
    maps:merge(#{op => <<"model_forward (window from zero states)">>,
                 shape => iolist_to_binary(io_lib:format("~s B1 L~b", [Name, SeqLen])),
                 dtype => ?F32, bytes => 0, reps => 300,
                 setup => fun() ->
                                  M = model(Device, Layers, Input, true),
                                  {M, fusex:model_init_state(M, 1),
                                   list_to_tuple([fusex_bench:uniform(?F32, {1, SeqLen, Input}, -1.0, 1.0, Device)
                                                  || _ <- lists:seq(1, 8)])}
                          end,
                 run => fun({M, S, Windows}, I) ->
                                ok = fusex:model_reset_state(M, S),
                                {Out, S} = fusex:model_forward(M, element(I rem 8 + 1, Windows), S),
                                Out
                        end,
                 teardown => fun teardown/1}, Extra).

%% A training step's forward, MSE loss, backward and AdamW on the resident
%% weights; the loss comes back as a float, so the call waits for it.
train_step(Device) ->
    {B, L, D} = {8, 2048, 768},
    #{op => <<"model_train_step (mse, adamw)">>,
      shape => <<"2-layer Mamba d768 N16 B8 L2048">>,
      dtype => ?F32, bytes => 0, reps => 20, kernel => false, sync => false,
      setup => fun() ->
                       M = model(Device, mamba_layers(D), D, true),
                       Opt = fusex:model_optimizer(M, #{lr => 1.0e-4, weight_decay => 0.01}),
                       X = fusex_bench:uniform(?F32, {B, L, D}, -1.0, 1.0, Device),
                       T = fusex_bench:uniform(?F32, {B, L, D}, -1.0, 1.0, Device),
                       {M, Opt, X, T}
               end,
      run => fun({M, Opt, X, T}, _) -> fusex:model_train_step(M, Opt, X, T, #{loss => mse}) end,
      teardown => fun({_, _Opt, X, T}) -> fusex:free(X), fusex:free(T) end}.
