%% @private
%% @doc Bench cases and `make demo' rows for the linear recurrences
%% (linear_scan, mingru, minlstm, liquid). The cases are the issue's table;
%% `bytes' is the floor: every input read once and every output written
%% once (for fwd+bwd: the forward's, then dh, the inputs and H read and the
%% gradients written).
-module(fusex_bench_linrec).

-export([cases/1, demo/1]).

-define(F32, {f, 32}).

cases(Device) ->
    [fwd(mingru, ?F32, {16, 1024, 1024}, Device, #{target_us => 55}),
     fwd_bwd(mingru, ?F32, {16, 1024, 1024}, Device, #{target_us => 170}),
     fwd(linear_scan, ?F32, {16, 1024, 1024}, Device, #{target_us => 55}),
     fwd(linear_scan, ?F32, {8, 2048, 1536}, Device, #{target_us => 75}),
     fwd(mingru, ?F32, {1, 65536, 256}, Device, #{target_us => 63}),
     fwd(mingru, ?F32, {1, 32, 512}, Device, #{e2e_target_us => 15, reps => 500}),
     fwd(minlstm, ?F32, {1, 32, 512}, Device, #{e2e_target_us => 15, reps => 500}),
     %% no targets: the other ops and dtypes at the main shape, and a step
     fwd(minlstm, ?F32, {16, 1024, 1024}, Device, #{}),
     fwd(liquid, ?F32, {16, 1024, 1024}, Device, #{}),
     fwd(mingru, {bf, 16}, {16, 1024, 1024}, Device, #{}),
     fwd_bwd(liquid, ?F32, {16, 1024, 1024}, Device, #{}),
     step(mingru, ?F32, {1, 512}, Device, #{reps => 500})].

%% ---- inputs ----

nseq(minlstm) -> 3;
nseq(liquid) -> 1;
nseq(_) -> 2.

%% The op's tensor arguments on Device: sequences, then liquid's tau and A.
inputs(Op, Type, {B, L, H}, Device) ->
    Seq = [seq_input(Op, K, Type, {B, L, H}, Device) || K <- lists:seq(1, nseq(Op))],
    case Op of
        liquid -> Seq ++ [fusex_bench:uniform(Type, {H}, 0.5, 2.0, Device),
                          fusex_bench:uniform(Type, {H}, -1.0, 1.0, Device)];
        _ -> Seq
    end.

seq_input(linear_scan, 1, Type, Shape, Device) -> fusex_bench:uniform(Type, Shape, 0.5, 1.0, Device);
seq_input(_, _, Type, Shape, Device) -> fusex_bench:uniform(Type, Shape, -2.0, 2.0, Device).

elem_bytes({_, Bits}) -> Bits div 8.

shape_text({B, L, H}) -> iolist_to_binary(io_lib:format("B~b L~b H~b", [B, L, H]));
shape_text({B, H}) -> iolist_to_binary(io_lib:format("B~b H~b (one frame)", [B, H])).

call(Op, Args, Opts) -> apply(fusex, Op, Args ++ [Opts]).

free_all(Ts) -> [catch fusex:free(T) || T <- Ts], ok.

%% ---- cases ----

%% Forward: reads every sequence input and liquid's [hidden] parameters,
%% writes H.
fwd(Op, Type, {B, L, H} = Shape, Device, Extra) ->
    N = B * L * H,
    Bytes = (nseq(Op) + 1) * N * elem_bytes(Type) + params_bytes(Op, Type, H),
    maps:merge(#{op => iolist_to_binary([atom_to_list(Op), " fwd"]), shape => shape_text(Shape),
                 dtype => Type, bytes => Bytes, reps => 100,
                 setup => fun() -> inputs(Op, Type, Shape, Device) end,
                 run => fun(Args, _) -> call(Op, Args, #{}) end,
                 teardown => fun free_all/1}, Extra).

%% Forward with save_for_backward, then the backward: the forward's bytes,
%% then dh, the sequence inputs and H read and their gradients written.
fwd_bwd(Op, Type, {B, L, H} = Shape, Device, Extra) ->
    N = B * L * H,
    E = elem_bytes(Type),
    Fwd = (nseq(Op) + 1) * N * E,
    Bwd = (nseq(Op) + 2) * N * E + nseq(Op) * N * E,
    maps:merge(#{op => iolist_to_binary([atom_to_list(Op), " fwd+bwd"]), shape => shape_text(Shape),
                 dtype => Type, bytes => Fwd + Bwd + 2 * params_bytes(Op, Type, H), reps => 50,
                 setup => fun() ->
                                  {inputs(Op, Type, Shape, Device),
                                   fusex_bench:uniform(Type, Shape, -1.0, 1.0, Device)}
                          end,
                 run => fun({Args, Dh}, _) ->
                                {Hs, Ctx} = call(Op, Args, #{save_for_backward => true}),
                                Grads = apply(fusex, backward_fun(Op), [Dh, Ctx]),
                                {Hs, Grads}
                        end,
                 teardown => fun({Args, Dh}) -> free_all([Dh | Args]) end}, Extra).

%% One frame with the state updated in place (end-to-end: NIF entry, one
%% launch, synchronize).
step(Op, Type, {B, H} = Shape, Device, Extra) ->
    Bytes = (nseq(Op) + 2) * B * H * elem_bytes(Type),
    maps:merge(#{op => iolist_to_binary([atom_to_list(Op), "_step"]), shape => shape_text(Shape),
                 dtype => Type, bytes => Bytes, reps => 200,
                 setup => fun() ->
                                  Frame = [fusex_bench:uniform(Type, Shape, -2.0, 2.0, Device)
                                           || _ <- lists:seq(1, nseq(Op))],
                                  {fusex:zeros({f, 32}, Shape, #{device => Device}), Frame}
                          end,
                 run => fun({State, Frame}, _) ->
                                apply(fusex, step_fun(Op), [State | Frame] ++ [#{}])
                        end,
                 teardown => fun({State, Frame}) -> free_all([State | Frame]) end}, Extra).

params_bytes(liquid, Type, H) -> 2 * H * elem_bytes(Type);
params_bytes(_, _, _) -> 0.

backward_fun(Op) -> list_to_atom(atom_to_list(Op) ++ "_backward").
step_fun(Op) -> list_to_atom(atom_to_list(Op) ++ "_step").

%% ---- make demo: every op on Device against the CPU in f64 ----

demo(Device) ->
    Shape = {3, 257, 70},
    [fwd_row(Op, ?F32, Shape, Device) || Op <- [linear_scan, mingru, minlstm, liquid]] ++
        [fwd_row(mingru, {bf, 16}, Shape, Device)] ++
        [bwd_row(Op, Shape, Device) || Op <- [linear_scan, mingru, minlstm, liquid]] ++
        [step_row(Op, Device) || Op <- [mingru, minlstm]].

%% The same inputs as f64 on the cpu.
on_cpu_f64(Ts) -> [fusex:convert(fusex:copy(T, cpu), {f, 64}) || T <- Ts].

demo_opts(mingru) -> #{candidate_activation => g, reverse => true};
demo_opts(minlstm) -> #{candidate_activation => g};
demo_opts(liquid) -> #{dt => 0.5};
demo_opts(linear_scan) -> #{}.

tolerance(?F32) -> 1.0e-5;
tolerance(_) -> 1.0e-2.

fwd_row(Op, Type, Shape, Device) ->
    Args = inputs(Op, Type, Shape, Device),
    Opts = demo_opts(Op),
    Got = call(Op, Args, Opts),
    Want = call(Op, on_cpu_f64(Args), Opts),
    #{op => iolist_to_binary([atom_to_list(Op), " fwd"]), shape => shape_text(Shape), dtype => Type,
      rel_l2 => fusex_demo:compare(Got, Want, Type), tolerance => tolerance(Type),
      us => fusex_demo:time_us(fun() -> call(Op, Args, Opts) end, 20)}.

%% The worst rel-L2 over every input's gradient.
bwd_row(Op, {B, _, H} = Shape, Device) ->
    Args = inputs(Op, ?F32, Shape, Device),
    H0 = fusex_bench:uniform(?F32, {B, H}, -1.0, 1.0, Device),
    Dh = fusex_bench:uniform(?F32, Shape, -1.0, 1.0, Device),
    Opts = (demo_opts(Op))#{h0 => H0, save_for_backward => true},
    Run = fun(As, Opts1, D) ->
                  {_, Ctx} = call(Op, As, Opts1),
                  apply(fusex, backward_fun(Op), [D, Ctx])
          end,
    Got = Run(Args, Opts, Dh),
    [H064, Dh64] = on_cpu_f64([H0, Dh]),
    Want = Run(on_cpu_f64(Args), Opts#{h0 => H064}, Dh64),
    Worst = lists:max([fusex_demo:compare(maps:get(K, Got), maps:get(K, Want), ?F32)
                       || K <- maps:keys(Want)]),
    #{op => iolist_to_binary([atom_to_list(Op), " fwd+bwd (all gradients)"]),
      shape => shape_text(Shape), dtype => ?F32, rel_l2 => Worst, tolerance => 1.0e-5,
      us => fusex_demo:time_us(fun() -> Run(Args, Opts, Dh) end, 20)}.

%% 40 steps from zeros against one forward on the cpu.
step_row(Op, Device) ->
    {B, L, H} = Shape = {2, 40, 96},
    Args = inputs(Op, ?F32, Shape, Device),
    State = fusex:zeros(?F32, {B, H}, #{device => Device}),
    Frames = [[fusex:copy(fusex:reshape(frame(A, T, Shape), {B, H}), Device) || A <- Args]
              || T <- lists:seq(0, L - 1)],
    Opts = maps:without([reverse], demo_opts(Op)),
    Step = fun(F) -> apply(fusex, step_fun(Op), [State | F] ++ [Opts]) end,
    [Step(F) || F <- Frames],
    {_, Want} = call(Op, on_cpu_f64(Args), Opts#{return_state => true}),
    Check = fusex_demo:compare(State, Want, ?F32),
    #{op => iolist_to_binary([atom_to_list(Op), "_step x40 (final state)"]),
      shape => <<"B2 H96">>, dtype => ?F32, rel_l2 => Check, tolerance => 1.0e-5,
      us => fusex_demo:time_us(fun() -> Step(hd(Frames)) end, 20)}.

%% Row T of a [B, L, H] tensor, as a [B, 1, H] tensor on the cpu.
frame(T, Row, {B, L, H}) ->
    {_, Bits} = fusex:type(T),
    Bin = fusex:to_binary(T),
    RowBytes = H * Bits div 8,
    Rows = [binary:part(Bin, (Bi * L + Row) * RowBytes, RowBytes) || Bi <- lists:seq(0, B - 1)],
    fusex:tensor(iolist_to_binary(Rows), fusex:type(T), {B, 1, H}, #{device => cpu}).
