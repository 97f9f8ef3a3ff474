%% @private
%% @doc Bench cases and demo rows for the selective scan (issue 3).
%%
%% Floors, counted per case in `bytes' (inputs read once, outputs written
%% once; the states a forward saves for the backward are not counted):
%% the large forward moves x, dt, z in and y out (4 x 100.7 MB in f32) plus
%% b, c (2 MB). Its real limit is the exponentials: B*L*D*N = 403M, one per
%% state and step, at ~16 per clock per SM (132 SMs at ~1.98 GHz: ~100 us);
%% see docs/SSM.md for the full count.
-module(fusex_bench_ssm).

-export([cases/1, demo/1]).

%% Inputs of a scan of shape {Batch, SeqLen, Dim, DState} on Device, in Mamba's
%% ranges, with d, z, dt_bias and softplus.
inputs({Bt, L, D, N}, Type, Device) ->
    U = fun(Shape, Lo, Hi) -> fusex_bench:uniform(Type, Shape, Lo, Hi, Device) end,
    F32 = fun(Shape, Lo, Hi) -> fusex_bench:uniform({f, 32}, Shape, Lo, Hi, Device) end,
    #{x => U({Bt, L, D}, -1, 1), dt => U({Bt, L, D}, -4, 1),
      a => F32({D, N}, -3, -0.05), b => U({Bt, L, N}, -1, 1), c => U({Bt, L, N}, -1, 1),
      opts => #{d => F32({D}, -1, 1), z => U({Bt, L, D}, -2, 2),
                dt_bias => F32({D}, -1, 0.5), dt_softplus => true}}.

scan(#{x := X, dt := Dt, a := A, b := B, c := C, opts := Opts}, Extra) ->
    fusex:selective_scan(X, Dt, A, B, C, maps:merge(Opts, Extra)).

free_inputs(Sets) when is_list(Sets) -> [free_inputs(S) || S <- Sets], ok;
free_inputs(#{opts := Opts} = In) ->
    [catch fusex:free(T) || T <- maps:values(maps:without([opts], In)) ++ maps:values(Opts),
                            is_reference(T)],
    ok.

%% Bytes of a forward: x, dt, z in and y out (the input type), b and c in,
%% a, d, dt_bias in (f32).
fwd_bytes({Bt, L, D, N}, Bytes) ->
    4 * Bt * L * D * Bytes + 2 * Bt * L * N * Bytes + (D * N + 2 * D) * 4.

%% The backward: x, dt, z, dy, b, c in; dx, ddt, dz, db, dc out.
bwd_bytes({Bt, L, D, N}, Bytes) ->
    7 * Bt * L * D * Bytes + 4 * Bt * L * N * Bytes + 2 * (D * N + 2 * D) * 4.

label({Bt, L, D, N}) ->
    iolist_to_binary(io_lib:format("B~b L~b D~b N~b, d z dt_bias softplus", [Bt, L, D, N])).

fwd_case(Shape, Type, Device, Extra) ->
    {_, Bits} = Type,
    Sets = maps:get(sets, Extra, 1),
    maps:merge(
      #{op => <<"selective_scan fwd">>, shape => label(Shape), dtype => Type,
        bytes => fwd_bytes(Shape, Bits div 8), reps => 50,
        setup => fun() -> list_to_tuple([inputs(Shape, Type, Device) || _ <- lists:seq(1, Sets)]) end,
        run => fun(In, I) -> scan(element(I rem Sets + 1, In), #{}) end,
        teardown => fun(In) -> free_inputs(tuple_to_list(In)) end},
      maps:without([sets], Extra)).

cases(Device) ->
    Big = {8, 2048, 1536, 16},
    [fwd_case(Big, {f, 32}, Device, #{target_us => 180, reps => 30}),
     #{op => <<"selective_scan fwd+bwd">>, shape => label(Big), dtype => {f, 32},
       bytes => fwd_bytes(Big, 4) + bwd_bytes(Big, 4), reps => 20, target_us => 700,
       setup => fun() ->
                        In = inputs(Big, {f, 32}, Device),
                        In#{dy => fusex_bench:uniform({f, 32}, {8, 2048, 1536}, -1, 1, Device)}
                end,
       run => fun(In = #{dy := Dy}, _) ->
                      {Y, Ctx} = scan(In, #{save_for_backward => true}),
                      {Y, fusex:selective_scan_backward(Dy, Ctx)}
              end,
       teardown => fun(In = #{dy := Dy}) -> fusex:free(Dy), free_inputs(In) end},
     %% The backward alone, from one saved context: where fwd+bwd's time goes.
     #{op => <<"selective_scan bwd">>, shape => label(Big), dtype => {f, 32},
       bytes => bwd_bytes(Big, 4), reps => 20,
       setup => fun() ->
                        In = inputs(Big, {f, 32}, Device),
                        {Y, Ctx} = scan(In, #{save_for_backward => true}),
                        fusex:free(Y),
                        {In, Ctx, fusex_bench:uniform({f, 32}, {8, 2048, 1536}, -1, 1, Device)}
                end,
       run => fun({_, Ctx, Dy}, _) -> fusex:selective_scan_backward(Dy, Ctx) end,
       teardown => fun({In, _, Dy}) -> fusex:free(Dy), free_inputs(In) end},
     fwd_case(Big, {bf, 16}, Device, #{target_us => 120, reps => 30}),
     %% Small cases fit in L2: four input sets in turn keep them honest.
     fwd_case({32, 60, 512, 16}, {f, 32}, Device, #{e2e_target_us => 25, reps => 200, sets => 4}),
     fwd_case({1, 32, 512, 16}, {f, 32}, Device, #{e2e_target_us => 15, reps => 300}),
     step_case(Device),
     cpu_case()].

%% One frame of inference: the state is updated in place.
step_case(Device) ->
    {Bt, D, N} = {1, 512, 16},
    #{op => <<"selective_scan_step">>, shape => <<"B1 D512 N16, d z dt_bias softplus">>,
      dtype => {f, 32}, bytes => 2 * Bt * D * N * 4 + 4 * Bt * D * 4 + 2 * Bt * N * 4 + D * N * 4,
      reps => 500, e2e_target_us => 12,
      setup => fun() ->
                       U = fun(Shape, Lo, Hi) -> fusex_bench:uniform({f, 32}, Shape, Lo, Hi, Device) end,
                       {fusex:zeros({f, 32}, {Bt, D, N}, #{device => Device}),
                        U({Bt, D}, -1, 1), U({Bt, D}, -4, 1), U({D, N}, -3, -0.05),
                        U({Bt, N}, -1, 1), U({Bt, N}, -1, 1),
                        #{d => U({D}, -1, 1), z => U({Bt, D}, -2, 2), dt_bias => U({D}, -1, 0.5),
                          dt_softplus => true}}
               end,
      run => fun({State, X, Dt, A, B, C, Opts}, _) ->
                     fusex:selective_scan_step(State, X, Dt, A, B, C, Opts)
             end}.

%% The CPU backend on the small forward (the target is for 2 cores).
cpu_case() ->
    Shape = {1, 32, 512, 16},
    Case = fwd_case(Shape, {f, 32}, cpu, #{e2e_target_us => 1000, reps => 50, kernel => false}),
    Case#{op => <<"selective_scan fwd (cpu backend)">>}.

%% ---- make demo ----

%% f64 copies on the CPU: the reference's inputs.
ref(T) -> fusex:convert(fusex:copy(T, cpu), {f, 64}).

ref_inputs(#{x := X, dt := Dt, a := A, b := B, c := C, opts := Opts}) ->
    #{x => ref(X), dt => ref(Dt), a => ref(A), b => ref(B), c => ref(C),
      opts => maps:map(fun(_, V) when is_reference(V) -> ref(V); (_, V) -> V end, Opts)}.

demo(Device) ->
    Shape = {Bt, L, D, N} = {2, 100, 64, 16},
    Text = <<"B2 L100 D64 N16, all options">>,
    F32 = inputs(Shape, {f, 32}, Device),
    H0 = fusex_bench:uniform({f, 32}, {Bt, D, N}, -1, 1, Device),
    In = F32#{opts := maps:put(h0, H0, maps:get(opts, F32))},
    Ref = ref_inputs(In),
    {Y, State} = scan(In, #{return_state => true}),
    {RefY, RefState} = scan(Ref, #{return_state => true}),
    Bf = inputs(Shape, {bf, 16}, Device),
    BfY = scan(Bf, #{}),
    Grads = grads(In, Device, {Bt, L, D}),
    RefGrads = grads(Ref, cpu, {Bt, L, D}),
    GradErr = lists:max([fusex_demo:compare(G, maps:get(K, RefGrads), {f, 32})
                         || {K, G} <- maps:to_list(Grads)]),
    Time = fun(F) -> fusex_demo:time_us(F, 30) end,
    [#{op => <<"selective_scan">>, shape => Text, dtype => {f, 32},
       rel_l2 => fusex_demo:compare(Y, RefY, {f, 32}), tolerance => 1.0e-5,
       us => Time(fun() -> scan(In, #{}) end)},
     #{op => <<"selective_scan final state">>, shape => Text, dtype => {f, 32},
       rel_l2 => fusex_demo:compare(State, RefState, {f, 32}), tolerance => 1.0e-5,
       us => Time(fun() -> scan(In, #{return_state => true}) end)},
     #{op => <<"selective_scan">>, shape => Text, dtype => {bf, 16},
       rel_l2 => fusex_demo:compare(BfY, scan(ref_inputs(Bf), #{}), {bf, 16}), tolerance => 1.0e-2,
       us => Time(fun() -> scan(Bf, #{}) end)},
     #{op => <<"selective_scan_backward (worst of 9 gradients)">>, shape => Text, dtype => {f, 32},
       rel_l2 => GradErr, tolerance => 1.0e-5,
       us => Time(fun() -> grads(In, Device, {Bt, L, D}) end)},
     step_row(Device)].

%% Forward with a context, then the backward with a fixed dy (seeded per
%% call site so the device and the reference see the same values).
grads(In = #{x := X}, Device, Shape) ->
    {_, Ctx} = scan(In, #{save_for_backward => true}),
    N = lists:foldl(fun(V, Acc) -> V * Acc end, 1, tuple_to_list(Shape)),
    Dy = fusex:tensor(<< <<(math:sin(I * 0.37)):32/float-native>> || I <- lists:seq(1, N) >>,
                      {f, 32}, Shape, #{device => Device}),
    fusex:selective_scan_backward(fusex:convert(Dy, fusex:type(X)), Ctx).

step_row(Device) ->
    {Bt, D, N} = {2, 64, 16},
    U = fun(Shape, Lo, Hi) -> fusex_bench:uniform({f, 32}, Shape, Lo, Hi, Device) end,
    State0 = U({Bt, D, N}, -1, 1),
    X = U({Bt, D}, -1, 1), Dt = U({Bt, D}, -4, 1), A = U({D, N}, -3, -0.05),
    B = U({Bt, N}, -1, 1), C = U({Bt, N}, -1, 1),
    Opts = #{d => U({D}, -1, 1), z => U({Bt, D}, -2, 2), dt_bias => U({D}, -1, 0.5),
             dt_softplus => true},
    RefState = ref(State0),
    RefY = fusex:selective_scan_step(RefState, ref(X), ref(Dt), ref(A), ref(B), ref(C),
                                     maps:map(fun(_, V) when is_reference(V) -> ref(V);
                                                 (_, V) -> V end, Opts)),
    State = fusex:copy(State0, Device),
    Y = fusex:selective_scan_step(State, X, Dt, A, B, C, Opts),
    Err = max(fusex_demo:compare(Y, RefY, {f, 32}), fusex_demo:compare(State, RefState, {f, 32})),
    Scratch = fusex:copy(State0, Device),
    #{op => <<"selective_scan_step (y and state)">>, shape => <<"B2 D64 N16, all options">>,
      dtype => {f, 32}, rel_l2 => Err, tolerance => 1.0e-5,
      us => fusex_demo:time_us(fun() -> fusex:selective_scan_step(Scratch, X, Dt, A, B, C, Opts) end, 30)}.
