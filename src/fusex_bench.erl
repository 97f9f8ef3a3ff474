%% @doc Benchmark harness: times ops on resident tensors and prints one
%% table (op, shape, dtype, device, median us, GB/s, % of the device's
%% measured copy bandwidth, end-to-end µs of the Erlang call).
%%
%% Kernel time is taken with device events (CUDA events on a GPU, the host
%% clock on the CPU) around one op, after a busy-wait kernel that keeps the
%% GPU occupied while the host enqueues the op, so host launch gaps are not
%% counted. End-to-end time is the Erlang call plus
%% {@link fusex:synchronize/1}: from request until the result is ready in
%% the caller's hands. Both are medians after warm-up; cases rotate among
%% several input sets where the inputs would otherwise sit in cache.
%%
%% Cases come from the modules `fusex_bench_<family>' exporting
%% `cases(Device)', found by name (see bench/README.md). From the shell: `fusex_bench:run(#{ops => [<<"scan">>]})'.
-module(fusex_bench).

-export([main/1, run/0, run/1, copy_bandwidth/1, print_table/1, median/1, uniform/5, family_modules/1]).

-export_type([bench_case/0, row/0]).

-type bench_case() :: #{op := binary(), shape := binary(), dtype := fusex:type() | binary(),
                        bytes := non_neg_integer(),
                        setup := fun(() -> term()),
                        run := fun((term(), non_neg_integer()) -> term()),
                        e2e => fun((term(), non_neg_integer()) -> term()),
                        teardown => fun((term()) -> term()),
                        reps => pos_integer(), target_us => number(),
                        e2e_target_us => number(), kernel => boolean(),
                        sync => boolean(), batch => pos_integer(), overhead => boolean()}.
%% `kernel => false': no device-event timing (host-only calls, transfers);
%% GB/s then comes from the end-to-end time. `sync => false': the
%% end-to-end time is the call alone. `batch => N': each end-to-end sample
%% times N calls and divides (for calls of a few microseconds).
%% `overhead => true': the e2e column shows end-to-end minus kernel time
%% (both medians of this run): what the Erlang call adds to the kernel.
-type row() :: #{atom() => term()}.

-define(SPIN_US, 200).

%% @doc Entry point for `make bench' and bench/fusex_bench.escript.
%% Arguments: `--ops Sub1,Sub2' (run cases whose op contains one of the
%% substrings), `--device cpu|cuda|cuda:N', `--out File' (also write the
%% table there), `--reps N'.
-spec main([string()]) -> no_return().
main(Args) ->
    Opts = parse_args(Args, #{}),
    try run(Opts) of
        _ -> halt(0)
    catch
        Class:Reason:Stack ->
            io:format(standard_error, "bench failed: ~p:~p~n~p~n", [Class, Reason, Stack]),
            halt(1)
    end.

parse_args(["--ops", Ops | Rest], Acc) ->
    parse_args(Rest, Acc#{ops => [list_to_binary(O) || O <- string:split(Ops, ",", all)]});
parse_args(["--device", "cpu" | Rest], Acc) -> parse_args(Rest, Acc#{device => cpu});
parse_args(["--device", "cuda" | Rest], Acc) -> parse_args(Rest, Acc#{device => {cuda, 0}});
parse_args(["--device", "cuda:" ++ N | Rest], Acc) ->
    parse_args(Rest, Acc#{device => {cuda, list_to_integer(N)}});
parse_args(["--out", File | Rest], Acc) -> parse_args(Rest, Acc#{out => File});
parse_args(["--reps", N | Rest], Acc) -> parse_args(Rest, Acc#{reps => list_to_integer(N)});
parse_args([], Acc) -> Acc;
parse_args([Other | _], _) -> error({bad_bench_argument, Other}).

%% @doc The family modules that export `Fun/1': every `fusex_bench_<family>'
%% module of the application (found where this module was loaded from),
%% `fusex_bench_core' first (its floors head the table), the others by name.
-spec family_modules(atom()) -> [module()].
family_modules(Fun) ->
    Names = case code:which(?MODULE) of
                Path when is_list(Path) ->
                    [list_to_atom(filename:basename(F, ".beam"))
                     || F <- filelib:wildcard("fusex_bench_*.beam", filename:dirname(Path))];
                _ ->
                    _ = application:load(fusex),
                    {ok, Modules} = application:get_key(fusex, modules),
                    [M || M <- Modules, lists:prefix("fusex_bench_", atom_to_list(M))]
            end,
    Ordered = lists:sort(fun(A, B) -> {A =/= fusex_bench_core, A} =< {B =/= fusex_bench_core, B} end,
                         lists:usort(Names)),
    [M || M <- Ordered, code:ensure_loaded(M) =:= {module, M}, erlang:function_exported(M, Fun, 1)].

%% @equiv run(#{})
-spec run() -> [row()].
run() -> run(#{}).

%% @doc Runs the selected cases on `device' (default: the default device)
%% and prints the table. Options: `ops' (substrings of op names), `device',
%% `reps', `out' (a file to write the table to).
-spec run(map()) -> [row()].
run(Opts) ->
    Device = maps:get(device, Opts, fusex:default_device()),
    Bandwidth = copy_bandwidth(Device),
    io:format("fusex bench on ~s: copy bandwidth ~.1f GB/s (read + write)~n",
              [device_name(Device), Bandwidth]),
    Cases = [C || M <- family_modules(cases), C <- M:cases(Device), selected(C, Opts)],
    Rows = [measure(Device, C, Bandwidth, Opts) || C <- Cases],
    Table = print_table(Rows),
    case Opts of
        #{out := File} -> ok = file:write_file(File, Table);
        _ -> ok
    end,
    Rows.

selected(#{op := Op}, #{ops := Subs}) -> lists:any(fun(S) -> binary:match(Op, S) =/= nomatch end, Subs);
selected(_, _) -> true.

device_name(Device) ->
    [Name] = [N || #{id := Id, name := N} <- fusex:devices(), Id =:= normalize(Device)],
    io_lib:format("~p (~s)", [Device, Name]).

normalize(cuda) -> {cuda, 0};
normalize(D) -> D.

%% @doc Device-to-device copy bandwidth in GB/s, counting bytes read plus
%% bytes written, over a 256 MiB buffer (median of 20): the ceiling that
%% memory-bound kernels are compared with.
-spec copy_bandwidth(fusex:device()) -> float().
copy_bandwidth(Device) ->
    Bytes = 256 bsl 20,
    Src = fusex:zeros({u, 8}, {Bytes}, #{device => Device}),
    Case = #{op => <<"copy">>, shape => <<>>, dtype => {u, 8}, bytes => 2 * Bytes,
             setup => fun() -> Src end, run => fun(S, _) -> fusex:copy(S, Device) end,
             reps => 20},
    {Us, _} = kernel_times(Device, Case, Src),
    fusex:free(Src),
    2 * Bytes / (median(Us) * 1.0e3).

measure(Device, Case = #{op := Op, setup := Setup}, Bandwidth, Opts) ->
    State = Setup(),
    try
        Reps = maps:get(reps, Opts, maps:get(reps, Case, 100)),
        Case1 = Case#{reps => Reps},
        warm_up(Device, Case1, State),
        Kernel = case maps:get(kernel, Case, true) of
                     true -> median(element(1, kernel_times(Device, Case1, State)));
                     false -> undefined
                 end,
        E2e = median(e2e_times(Device, Case1, State)),
        Bytes = maps:get(bytes, Case),
        Gbs = case {Kernel, Bytes} of
                  {_, 0} -> undefined;
                  {undefined, _} -> Bytes / (E2e * 1.0e3);
                  _ -> Bytes / (Kernel * 1.0e3)
              end,
        #{op => Op, shape => maps:get(shape, Case), dtype => maps:get(dtype, Case),
          device => Device, median_us => Kernel, gbs => Gbs,
          pct => case Gbs of undefined -> undefined; _ -> 100 * Gbs / Bandwidth end,
          e2e_us => case maps:get(overhead, Case, false) of
                        true -> E2e - Kernel;
                        false -> E2e
                    end,
          target_us => maps:get(target_us, Case, undefined),
          e2e_target_us => maps:get(e2e_target_us, Case, undefined)}
    after
        (maps:get(teardown, Case, fun(_) -> ok end))(State),
        fusex:synchronize(Device)
    end.

warm_up(Device, #{run := Run}, State) ->
    [release(Run(State, I)) || I <- lists:seq(1, 5)],
    fusex:synchronize(Device).

kernel_times(Device, #{run := Run, reps := Reps}, State) ->
    Start = fusex_nif:event_new(Device),
    Stop = fusex_nif:event_new(Device),
    Us = [begin
              ok = fusex_nif:busy_wait(Device, ?SPIN_US),
              ok = fusex_nif:event_record(Start),
              R = Run(State, I),
              ok = fusex_nif:event_record(Stop),
              T = fusex_nif:event_elapsed_us(Start, Stop),
              release(R),
              T
          end || I <- lists:seq(1, Reps)],
    {Us, ok}.

e2e_times(Device, Case = #{reps := Reps}, State) ->
    Call = maps:get(e2e, Case, maps:get(run, Case)),
    Sync = maps:get(sync, Case, true),
    Batch = maps:get(batch, Case, 1),
    fusex:synchronize(Device),
    [begin
         T0 = erlang:monotonic_time(nanosecond),
         R = call_batch(Call, State, I, Batch),
         Sync andalso (ok = fusex:synchronize(Device)),
         T1 = erlang:monotonic_time(nanosecond),
         release(R),
         (T1 - T0) / 1000 / Batch
     end || I <- lists:seq(1, Reps)].

call_batch(Call, State, I, 1) -> Call(State, I);
call_batch(Call, State, I, N) -> Call(State, I), call_batch(Call, State, I, N - 1).

%% Frees every tensor in an op's result right away, so a long run does not
%% wait for the garbage collector to return device memory.
release(T) when is_reference(T) -> catch fusex:free(T), ok;
release(T) when is_tuple(T) -> [release(E) || E <- tuple_to_list(T)], ok;
release(T) when is_list(T) -> [release(E) || E <- T], ok;
release(T) when is_map(T) -> [release(E) || E <- maps:values(T)], ok;
release(_) -> ok.

%% @doc A tensor of `Type' and `Shape' on `Device' with values spread
%% uniformly over [Lo, Hi] (256 levels: random bytes mapped on the device,
%% fast enough for inputs of hundreds of megabytes).
-spec uniform(fusex:type(), fusex:shape(), number(), number(), fusex:device()) -> fusex:tensor().
uniform(Type, Shape, Lo, Hi, Device) ->
    N = lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)),
    Opts = #{device => Device},
    Bytes = fusex:tensor(rand:bytes(N), {u, 8}, Shape, Opts),
    Offset = fusex:tensor(binary:copy(<<(float(Lo)):32/float-native>>, N), {f, 32}, Shape, Opts),
    Scaled = fusex:scale(fusex:convert(Bytes, {f, 32}), (Hi - Lo) / 255),
    F32 = fusex:add(Scaled, Offset),
    Out = case Type of
              {f, 32} -> F32;
              _ -> fusex:convert(F32, Type)
          end,
    [fusex:free(T) || T <- [Bytes, Offset, Scaled | [F32 || Type =/= {f, 32}]]],
    Out.

%% @doc The median of a list of numbers.
-spec median([number()]) -> number().
median(Xs) ->
    S = lists:sort(Xs),
    N = length(S),
    case N rem 2 of
        1 -> lists:nth(N div 2 + 1, S);
        0 -> (lists:nth(N div 2, S) + lists:nth(N div 2 + 1, S)) / 2
    end.

%% @doc Prints the rows as a markdown table and returns its text.
-spec print_table([row()]) -> iolist().
print_table(Rows) ->
    Header = "| op | shape | dtype | device | median us | GB/s | % copy BW | e2e us | target us (kernel / e2e) |\n"
             "|---|---|---|---|---:|---:|---:|---:|---|\n",
    Lines = [io_lib:format("| ~ts | ~ts | ~s | ~s | ~s | ~s | ~s | ~s | ~s |~n",
                           [Op, Shape, fmt_type(Type), fmt_device(Dev), num(K), num(G), num(P),
                            num(E), targets(T, ET)])
             || #{op := Op, shape := Shape, dtype := Type, device := Dev, median_us := K,
                  gbs := G, pct := P, e2e_us := E, target_us := T, e2e_target_us := ET} <- Rows],
    Table = [Header | Lines],
    io:format("~n~ts~n", [Table]),
    Table.

fmt_type({K, B}) -> io_lib:format("{~s,~b}", [K, B]);
fmt_type(Other) -> io_lib:format("~s", [Other]).

fmt_device(cpu) -> "cpu";
fmt_device(cuda) -> "cuda:0";
fmt_device({cuda, N}) -> io_lib:format("cuda:~b", [N]).

num(undefined) -> "-";
num(X) when X >= 100 -> integer_to_list(round(X));
num(X) when X >= 10 -> io_lib:format("~.1f", [float(X)]);
num(X) -> io_lib:format("~.2f", [float(X)]).

targets(undefined, undefined) -> "";
targets(T, ET) -> io_lib:format("~s / ~s", [num_or_dash(T), num_or_dash(ET)]).

num_or_dash(undefined) -> "-";
num_or_dash(X) -> num(X).
