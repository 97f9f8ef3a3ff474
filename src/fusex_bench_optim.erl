%% @private
%% @doc Bench cases and demo rows for the optimizers (issue 4).
%%
%% The model of the issue: 75.6M parameters in 148 tensors
%% (40 x {1024,1024}, 8 x {4096,1024}, 100 x {1024}). Bytes are the floor
%% (every array read once and written once per step):
%%   AdamW f32:   p, g, m, v read + p, m, v written = 28 B/param (2.12 GB)
%%   + clipping:  the norm pass reads g once more   = 32 B/param (2.42 GB)
%%   bf16 + f32 master, bf16 grads: master, g(2), m, v read +
%%                master, m, v, param(2) written     = 28 B/param
%%   SGD momentum f32: p, g, b read + p, b written   = 20 B/param
-module(fusex_bench_optim).

-export([cases/1, demo/1, model_shapes/0]).

%% @doc The issue's 148 tensors.
model_shapes() ->
    lists:duplicate(40, {1024, 1024}) ++ lists:duplicate(8, {4096, 1024}) ++
        lists:duplicate(100, {1024}).

numel(Shape) -> lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)).

params() -> lists:sum([numel(S) || S <- model_shapes()]).

cases(Device) ->
    N = params(),
    Shape = iolist_to_binary(io_lib:format("148 tensors, ~.1fM params", [N / 1.0e6])),
    %% 75.6M parameters take seconds per step on a CPU
    Reps = case Device of cpu -> 3; _ -> 100 end,
    [#{op => <<"adamw_step">>, shape => Shape, dtype => {f, 32}, bytes => 28 * N,
       reps => Reps, target_us => 560, e2e_target_us => 590,
       setup => fun() -> setup(Device, adamw, {f, 32}, {f, 32}, #{}) end,
       run => fun step/2, teardown => fun teardown/1},
     %% The issue's "call overhead on top of kernel time" for this step:
     %% end-to-end minus kernel, both medians of the same run.
     #{op => <<"adamw_step, e2e minus kernel">>, shape => Shape, dtype => {f, 32}, bytes => 0,
       reps => Reps, overhead => true, e2e_target_us => 30,
       setup => fun() -> setup(Device, adamw, {f, 32}, {f, 32}, #{}) end,
       run => fun step/2, teardown => fun teardown/1},
     %% A training loop's gradients are new tensors every step: the table
     %% changes, is checked for aliasing and uploaded each time.
     #{op => <<"adamw_step, new grads each step, e2e minus kernel">>, shape => Shape,
       dtype => {f, 32}, bytes => 0, reps => Reps, overhead => true,
       setup => fun() -> setup_alternating(Device) end,
       run => fun step_alternating/2, teardown => fun teardown_alternating/1},
     #{op => <<"adamw_step max_grad_norm">>, shape => Shape, dtype => {f, 32}, bytes => 32 * N,
       reps => Reps, target_us => 672,
       setup => fun() -> setup(Device, adamw, {f, 32}, {f, 32}, #{max_grad_norm => 1.0}) end,
       run => fun step/2, teardown => fun teardown/1},
     #{op => <<"adamw_step skip_nonfinite + max_grad_norm">>, shape => Shape, dtype => {f, 32},
       bytes => 32 * N, reps => Reps, target_us => 672,
       setup => fun() -> setup(Device, adamw, {f, 32}, {f, 32},
                               #{max_grad_norm => 1.0, skip_nonfinite => true}) end,
       run => fun step/2, teardown => fun teardown/1},
     #{op => <<"adamw_step bf16 params + f32 master, bf16 grads">>, shape => Shape,
       dtype => {bf, 16}, bytes => 28 * N, reps => Reps,
       setup => fun() -> setup(Device, adamw, {bf, 16}, {bf, 16}, #{master_weights => true}) end,
       run => fun step/2, teardown => fun teardown/1},
     #{op => <<"sgd_step momentum 0.9">>, shape => Shape, dtype => {f, 32}, bytes => 20 * N,
       reps => Reps,
       setup => fun() -> setup(Device, sgd, {f, 32}, {f, 32}, #{momentum => 0.9}) end,
       run => fun step/2, teardown => fun teardown/1},
     %% The host side of a step: 148 one-element tensors, so the time is
     %% the Erlang call, the checks, the launch and the synchronize.
     #{op => <<"adamw_step call overhead">>, shape => <<"148 tensors of 1 element">>,
       dtype => {f, 32}, bytes => 0, reps => 500, e2e_target_us => 30,
       setup => fun() -> setup_tiny(Device) end, run => fun step/2,
       teardown => fun teardown/1}].

setup(Device, Kind, ParamType, GradType, Opts) ->
    Params = [fusex_bench:uniform(ParamType, S, -1, 1, Device) || S <- model_shapes()],
    Grads = [fusex_bench:uniform(GradType, S, -0.01, 0.01, Device) || S <- model_shapes()],
    State = init(Kind, Params, Opts),
    fusex:synchronize(Device),
    {Kind, State, Params, Grads}.

%% Two sets of gradients, used in turn.
setup_alternating(Device) ->
    {adamw, State, Params, Grads} = setup(Device, adamw, {f, 32}, {f, 32}, #{}),
    Grads2 = [fusex_bench:uniform({f, 32}, S, -0.01, 0.01, Device) || S <- model_shapes()],
    fusex:synchronize(Device),
    {State, Params, {Grads, Grads2}}.

step_alternating({State, Params, Sets}, I) ->
    fusex:adamw_step(State, Params, element(1 + I rem 2, Sets), #{}),
    ok.

teardown_alternating({State, Params, {Grads, Grads2}}) ->
    [fusex:free(T) || T <- Grads2],
    teardown({adamw, State, Params, Grads}).

setup_tiny(Device) ->
    Params = [fusex:zeros({f, 32}, {1}, #{device => Device}) || _ <- model_shapes()],
    Grads = [fusex:zeros({f, 32}, {1}, #{device => Device}) || _ <- model_shapes()],
    {adamw, init(adamw, Params, #{}), Params, Grads}.

init(adamw, Params, Opts) -> fusex:adamw_init(Params, Opts);
init(sgd, Params, Opts) -> fusex:sgd_init(Params, Opts).

%% Returns ok, not the state: the harness frees every tensor in a result.
step({adamw, State, Params, Grads}, _) -> fusex:adamw_step(State, Params, Grads, #{}), ok;
step({sgd, State, Params, Grads}, _) -> fusex:sgd_step(State, Params, Grads, #{}), ok.

teardown({_, State, Params, Grads}) ->
    [fusex:free(T) || T <- Params ++ Grads],
    [fusex:free(T) || {_, V} <- maps:to_list(State), T <- tensors(V)],
    ok.

tensors(T) when is_list(T) -> T;
tensors(T) when is_reference(T) -> [T || is_tensor(T)];
tensors(_) -> [].

is_tensor(T) -> try fusex:type(T) of _ -> true catch error:_ -> false end.

%% ---- make demo: 3 steps on Device against the same steps on cpu ----

-define(DEMO_SHAPES, [{1}, {3, 5}, {1023}, {1025}, {16385}]).

demo(Device) ->
    Rows = [{<<"adamw_step x3">>, adamw, {f, 32}, {f, 32}, #{lr => 0.01}, 1.0e-6},
            {<<"adamw_step x3 amsgrad, clip, skip">>, adamw, {f, 32}, {bf, 16},
             #{lr => 0.01, amsgrad => true, max_grad_norm => 0.5, skip_nonfinite => true}, 1.0e-6},
            {<<"adamw_step x3 bf16 params + master">>, adamw, {bf, 16}, {bf, 16},
             #{lr => 0.01, master_weights => true}, 1.0e-2},
            {<<"sgd_step x3 nesterov, clip">>, sgd, {f, 32}, {f, 32},
             #{lr => 0.05, momentum => 0.9, nesterov => true, max_grad_norm => 0.5}, 1.0e-6}],
    [demo_row(Device, Name, Kind, PT, GT, Opts, Tol) || {Name, Kind, PT, GT, Opts, Tol} <- Rows].

demo_row(Device, Name, Kind, ParamType, GradType, Opts, Tol) ->
    P0 = [fusex_bench:uniform(ParamType, S, -1, 1, Device) || S <- ?DEMO_SHAPES],
    Gs = [[fusex_bench:uniform(GradType, S, -0.1, 0.1, Device) || S <- ?DEMO_SHAPES]
          || _ <- lists:seq(1, 3)],
    OnCpu = fun(Ts) -> [fusex:copy(T, cpu) || T <- Ts] end,
    {Params, CpuParams} = {P0, OnCpu(P0)},
    State = init(Kind, Params, Opts),
    CpuState = init(Kind, CpuParams, Opts),
    [begin
         step({Kind, State, Params, G}, 0),
         step({Kind, CpuState, CpuParams, OnCpu(G)}, 0)
     end || G <- Gs],
    Err = fusex_demo:rel_l2(flat(Params), flat(CpuParams)),
    Us = fusex_demo:time_us(fun() -> step({Kind, State, Params, hd(Gs)}, 0), hd(Params) end, 20),
    #{op => Name, shape => <<"5 tensors, 1..16385">>, dtype => ParamType, rel_l2 => Err,
      tolerance => Tol, us => Us}.

flat(Tensors) -> lists:append([fusex_demo:values(T) || T <- Tensors]).
