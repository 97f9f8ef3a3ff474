%% @doc `make selftest' (part of `make test'): runs every implemented op on every available device on
%% fresh random inputs and prints, per op, the rel-L2 error against the CPU
%% reference (f64 accumulation) and the end-to-end time of the call.
%%
%% Families contribute rows through `demo(Device)' in their
%% `fusex_bench_<family>' module (found by name, fusex_bench:family_modules/1);
%% each row is a map
%% `#{op, shape, dtype, rel_l2, tolerance, us}'.
-module(fusex_selftest).

-export([main/0, run/0, rows/1, compare/3, time_us/2, values/1, rel_l2/2]).

%% @private
main() ->
    try run() of
        ok -> halt(0);
        failed -> halt(1)
    catch
        C:R:S ->
            io:format(standard_error, "selftest failed: ~p:~p~n~p~n", [C, R, S]),
            halt(1)
    end.

%% @doc Prints the devices, then one table per device; `failed' if any op
%% missed its tolerance.
-spec run() -> ok | failed.
run() ->
    Seed = erlang:system_time() rem 1000000007,
    rand:seed(exsss, Seed),
    io:format("fusex selftest (seed ~b)~n~n", [Seed]),
    Devices = fusex:devices(),
    [io:format("  ~p: ~s~s~n", [Id, Name, unavailable(D)]) || D = #{id := Id, name := Name} <- Devices],
    Results = [device_table(Id) || #{id := Id} <- Devices],
    case lists:all(fun(R) -> R end, Results) of
        true -> io:format("~nall ops match the CPU reference~n"), ok;
        false -> io:format("~nSOME OPS MISSED THEIR TOLERANCE~n"), failed
    end.

unavailable(#{cuda_unavailable := Why}) -> io_lib:format("  (CUDA unavailable: ~s)", [Why]);
unavailable(_) -> "".

device_table(Device) ->
    Rows = rows(Device),
    io:format("~n~p~n| op | shape | dtype | rel-L2 vs cpu f64 | tolerance | ok | e2e us |~n"
              "|---|---|---|---:|---:|---|---:|~n", [Device]),
    [io:format("| ~s | ~s | ~s | ~.3e | ~.2e | ~s | ~.1f |~n",
               [Op, Shape, fmt_type(T), float(E), float(Tol), ok_mark(E, Tol), float(Us)])
     || #{op := Op, shape := Shape, dtype := T, rel_l2 := E, tolerance := Tol, us := Us} <- Rows],
    lists:all(fun(#{rel_l2 := E, tolerance := Tol}) -> is_float(E) andalso E =< Tol end, Rows).

ok_mark(E, Tol) when is_float(E), E =< Tol -> "yes";
ok_mark(_, _) -> "NO".

fmt_type({K, B}) -> io_lib:format("{~s,~b}", [K, B]).

%% @doc The demo rows of every family module present, on `Device'.
-spec rows(fusex:device()) -> [map()].
rows(Device) ->
    [Row || M <- fusex_bench:family_modules(demo), Row <- M:demo(Device)].

%% @doc rel-L2 of tensor `Got' against `Want' (a tensor or a list of
%% numbers); non-finite values give infinity.
-spec compare(fusex:tensor(), fusex:tensor() | [number()], fusex:type()) -> float() | infinity.
compare(Got, Want, _Type) ->
    G = values(Got),
    W = case is_list(Want) of true -> Want; false -> values(Want) end,
    rel_l2(G, W).

%% @doc The tensor's elements as floats (NaN and infinities as atoms), read
%% through the CPU in f64.
-spec values(fusex:tensor()) -> [float() | atom()].
values(T) ->
    F64 = fusex:convert(fusex:copy(T, cpu), {f, 64}),
    [case B of <<V:64/float-native>> -> V; _ -> nan end || <<B:8/binary>> <= fusex:to_binary(F64)].

%% @doc ||G - W|| / ||W|| over two lists; anything not a float gives infinity.
-spec rel_l2([float() | atom()], [float() | atom()]) -> float() | infinity.
rel_l2(G, W) ->
    case lists:all(fun is_float/1, G ++ W) of
        false -> infinity;
        true ->
            D = lists:sum([(A - B) * (A - B) || {A, B} <- lists:zip(G, W)]),
            R = lists:sum([B * B || B <- W]),
            if R == 0, D == 0 -> 0.0; R == 0 -> infinity; true -> math:sqrt(D / R) end
    end.

%% @doc Median end-to-end microseconds of `Fun()' plus a device
%% synchronize, over `Reps' calls after two warm-ups.
-spec time_us(fun(() -> term()), pos_integer()) -> float().
time_us(Fun, Reps) ->
    Fun(), Fun(),
    Ts = [begin
              T0 = erlang:monotonic_time(nanosecond),
              R = Fun(),
              sync(R),
              (erlang:monotonic_time(nanosecond) - T0) / 1000
          end || _ <- lists:seq(1, Reps)],
    fusex_bench:median(Ts).

sync(T) when is_reference(T) -> catch fusex:synchronize(T);
sync(T) when is_tuple(T) -> [sync(E) || E <- tuple_to_list(T)];
sync(T) when is_map(T) -> [sync(E) || E <- maps:values(T)];
sync(T) when is_list(T) -> [sync(E) || E <- T];
sync(_) -> ok.
