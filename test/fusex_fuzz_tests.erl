%% EUnit: a seeded fuzz of the whole API. Each case is a call built from a
%% generator (random shapes with zeros and ones, every type, option maps,
%% freed tensors, junk terms in every position of every exported function,
%% views at offsets, huge empty tensors) and runs in a monitored process
%% with a time limit. A case passes when the call raises a clean error
%% ({badarg, Msg} whose Msg names an argument, {out_of_memory, Msg},
%% {cuda_error, Code, Msg}) or returns a result that is right: calls that
%% are valid by construction must succeed, and their results are checked
%% against pure-Erlang references (elementwise ops, conversions, copies,
%% the linear recurrences, the selective scan, the layers (causal conv1d,
%% the norms, linear), the GRU and the LSTM, the optimizers) or, for
%% gradients, against central differences of the forward in f64. Anything
%% else fails: another exception, a hang, a wrong or unwritten value (the
%% heap is filled with freed NaN tensors before the valid cases, so memory
%% an op forgets to write reads as NaN), and a VM crash ends the run.
%%
%% Deterministic given its seed: case I draws everything from its own
%% generator seeded with {Seed, I}, so one case replays alone.
%%
%%   FUSEX_FUZZ_SEED=S     the seed (default: FUSEX_SEED, else the clock); printed
%%   FUSEX_FUZZ_CASES=N    how many cases (default 20000: 8 to 25 s on 2 cores)
%%   FUSEX_FUZZ_CASE=I     run case I only (with its seed: a failure's replay)
%%   FUSEX_FUZZ_TRACE=1    print every case before it runs (to find the one
%%                         that took the VM down)
-module(fusex_fuzz_tests).

-include_lib("eunit/include/eunit.hrl").

-export([run/2]).

-define(FLOATS, [{f, 32}, {f, 64}, {bf, 16}, {f, 16}]).
-define(INTS, [{s, 32}, {s, 64}, {u, 8}]).
-define(TYPES, (?FLOATS ++ ?INTS)).
-define(CASE_TIMEOUT, 30000).

fuzz_test_() ->
    {timeout, 3600, fun() -> ok = run(seed(), case_ids()) end}.

seed() ->
    Seed = case {os:getenv("FUSEX_FUZZ_SEED"), os:getenv("FUSEX_SEED")} of
               {false, false} -> erlang:unique_integer([positive]) bxor erlang:system_time();
               {false, S} -> list_to_integer(S);
               {S, _} -> list_to_integer(S)
           end,
    Seed band (1 bsl 58 - 1).

case_ids() ->
    case os:getenv("FUSEX_FUZZ_CASE") of
        false -> lists:seq(1, list_to_integer(os:getenv("FUSEX_FUZZ_CASES", "20000")));
        I -> [list_to_integer(I)]
    end.

%% ---- the run ----

run(Seed, Ids) ->
    Device = fusex_test_util:device(),
    io:format(user, "~n  fusex fuzz: FUSEX_FUZZ_SEED=~b, ~b cases on ~p~n", [Seed, length(Ids), Device]),
    Before = maps:with([allocated, live_tensors], fusex_test_util:settled_memory(Device)),
    Trace = os:getenv("FUSEX_FUZZ_TRACE") =:= "1",
    T0 = erlang:monotonic_time(millisecond),
    Outcomes = [begin
                    Trace andalso io:format(user, "  case ~b~n", [I]),
                    progress(I, length(Ids), T0),
                    {I, run_case(Seed, I, Device)}
                end || I <- Ids],
    Fails = [{I, O} || {I, {fail, _, _, _} = O} <- Outcomes],
    report(Seed, Outcomes, Fails, erlang:monotonic_time(millisecond) - T0),
    After = maps:with([allocated, live_tensors], fusex_test_util:settled_memory(Device)),
    case {Fails, After} of
        {[], Before} -> ok;
        {[], _} -> error({memory_not_back_to_baseline, Before, After, {seed, Seed}});
        _ -> error({fuzz_failures, length(Fails), {seed, Seed}})
    end.

progress(I, N, T0) when I rem 1000 =:= 0, N > 1 ->
    io:format(user, "  ... ~b cases, ~b s~n", [I, (erlang:monotonic_time(millisecond) - T0) div 1000]);
progress(_, _, _) -> ok.

report(Seed, Outcomes, Fails, Ms) ->
    Counts = lists:foldl(fun({_, {Verdict, Kind, _, _}}, Acc) ->
                                 maps:update_with({Kind, Verdict}, fun(C) -> C + 1 end, 1, Acc)
                         end, #{}, Outcomes),
    Kinds = lists:usort([K || {K, _} <- maps:keys(Counts)]),
    io:format(user, "  fusex fuzz: ~b cases in ~.1f s; by kind (checked results / clean errors):~n",
              [length(Outcomes), Ms / 1000]),
    [io:format(user, "    ~-22s ~5b / ~5b~n",
               [atom_to_list(K), maps:get({K, checked}, Counts, 0), maps:get({K, clean_error}, Counts, 0)])
     || K <- Kinds],
    [io:format(user, "  FAILED case ~b (replay: FUSEX_FUZZ_SEED=~b FUSEX_FUZZ_CASE=~b)~n    ~p: ~0tP~n    why: ~0tP~n",
               [I, Seed, I, Kind, Desc, 12, Why, 30])
     || {I, {fail, Kind, Desc, Why}} <- lists:sublist(Fails, 20)],
    ok.

%% One case in a process of its own: {checked | clean_error | fail, Kind, Desc, Detail}.
run_case(Seed, I, Device) ->
    Parent = self(),
    {Pid, Ref} = spawn_monitor(fun() ->
                                       rand:seed(exsss, {Seed, I, 16#F5}),
                                       put(fuzz_device, Device),
                                       try gen_case() of
                                           #{kind := Kind, desc := Desc} = Case ->
                                               Parent ! {fuzz_case, self(), Kind, Desc}, % for a hang's report
                                               exit({fuzz_outcome, outcome(Case), Kind, Desc})
                                       catch Class:Reason:Stack ->
                                               exit({fuzz_outcome, {fail, {generator, Class, Reason, Stack}},
                                                     generator, none})
                                       end
                               end),
    Result = receive
                 {'DOWN', Ref, process, Pid, {fuzz_outcome, {Verdict, Why}, Kind, Desc}} -> {Verdict, Kind, Desc, Why};
                 {'DOWN', Ref, process, Pid, Other} -> {fail, generator, none, {case_process_died, Other}}
             after ?CASE_TIMEOUT ->
                     exit(Pid, kill),
                     receive
                         {fuzz_case, Pid, HungKind, HungDesc} -> {fail, HungKind, HungDesc, {hang, ?CASE_TIMEOUT}}
                     after 0 -> {fail, unknown, none, {hang, ?CASE_TIMEOUT}}
                     end
             end,
    receive {fuzz_case, Pid, _, _} -> ok after 0 -> ok end,
    Result.

%% A case: #{kind, desc, run := fun() -> Result, expect := valid | error | any,
%% check := fun(Result) -> ok | {fail, Why}}. `error' cases may name the
%% argument the message must start with (`arg').
outcome(Case = #{run := Run, expect := Expect}) ->
    Check = maps:get(check, Case, fun(R) -> sane(R) end),
    try Run() of
        Result when Expect =:= error -> {fail, {expected_an_error, got, summary(Result)}};
        Result ->
            case catch Check(Result) of
                ok -> {checked, ok};
                {fail, Why} -> {fail, Why};
                Crash -> {fail, {check_crashed, Crash}}
            end
    catch
        error:{badarg, Msg} when is_binary(Msg), Expect =/= valid -> clean_badarg(Msg, Case);
        error:{out_of_memory, Msg} when is_binary(Msg), Expect =/= valid -> {clean_error, oom};
        error:{cuda_error, Code, Msg} when is_integer(Code), is_binary(Msg), Expect =/= valid ->
            {clean_error, cuda};
        Class:Reason:Stack -> {fail, {Class, Reason, lists:sublist(Stack, 3)}}
    end.

%% "name: expected ..." (name[i] for list items, name[i].key for a map's
%% in a list: "layers[1].w_hh"), naming the argument the case broke when it
%% says which.
clean_badarg(Msg, Case) ->
    case re:run(Msg, "^([a-z_][a-z0-9_]*(?:\\[[0-9]+\\]\\.[a-z_][a-z0-9_]*)?)(\\[[0-9]+\\])?: expected ",
                [{capture, [1], binary}]) of
        {match, [Name]} ->
            case maps:find(arg, Case) of
                {ok, Arg} when Arg =/= Name -> {fail, {badarg_names, Name, expected, Arg, Msg}};
                _ -> {clean_error, badarg}
            end;
        nomatch -> {fail, {badarg_message_unclear, Msg}}
    end.

summary(T) when is_reference(T) -> {tensor, catch fusex:shape(T), catch fusex:type(T)};
summary(T) when is_tuple(T) -> list_to_tuple([summary(E) || E <- tuple_to_list(T)]);
summary(M) when is_map(M) -> maps:map(fun(_, V) -> summary(V) end, M);
summary(L) when is_list(L) -> [summary(E) || E <- L];
summary(X) -> X.

%% A result nothing more is known about: every tensor in it is live, and
%% its bytes are as many as its shape and type say.
sane(R) ->
    Bad = [T || T <- tensors_in(R), not tensor_sane(T)],
    case Bad of
        [] -> ok;
        _ -> {fail, {insane_tensors, [summary(T) || T <- Bad]}}
    end.

tensors_in(T) when is_reference(T) -> [T];
tensors_in(T) when is_tuple(T) -> lists:append([tensors_in(E) || E <- tuple_to_list(T)]);
tensors_in(M) when is_map(M) -> lists:append([tensors_in(V) || V <- maps:values(M)]);
tensors_in(L) when is_list(L) -> lists:append([tensors_in(E) || E <- L]);
tensors_in(_) -> [].

tensor_sane(T) ->
    case catch {fusex:shape(T), fusex:type(T)} of
        {Shape, {_, Bits}} when is_tuple(Shape) ->
            byte_size(fusex:to_binary(T)) =:= numel(Shape) * Bits div 8;
        _ -> not is_tensor(T) % another reference (a context, a state)
    end.

is_tensor(T) -> fusex_nif:is_live(T) orelse (catch fusex:free(T)) =:= ok.

%% ---- random values (the case's own generator) ----

u() -> rand:uniform().
ri(N) -> rand:uniform(N).
pick(L) -> lists:nth(ri(length(L)), L).
chance(P) -> u() < P.
range(Lo, Hi) -> Lo + (Hi - Lo) * u().

weighted(Pairs) ->
    Total = lists:sum([W || {W, _} <- Pairs]),
    pick_weighted(u() * Total, Pairs).
pick_weighted(X, [{W, V} | _]) when X < W -> V;
pick_weighted(X, [{W, _} | Rest]) when Rest =/= [] -> pick_weighted(X - W, Rest);
pick_weighted(_, [{_, V}]) -> V.

dim() -> weighted([{1, 0}, {3, 1}, {3, 2}, {2, 3}, {1, 5}, {1, 7}]).
pos_dim() -> weighted([{3, 1}, {3, 2}, {2, 3}, {1, 5}]).
shape() -> list_to_tuple([dim() || _ <- lists:seq(1, ri(5) - 1)]).
numel(Shape) -> lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)).

values(Type, N) -> [value(Type) || _ <- lists:seq(1, N)].
value({u, 8}) -> ri(256) - 1;
value({s, 32}) -> ri(1 bsl 32) - (1 bsl 31) - 1;
value({s, 64}) -> ri(1 bsl 64) - (1 bsl 63) - 1;
value(_) -> rand:normal().

%% Float values with, now and then, a NaN or an infinity (atoms: Erlang
%% floats have neither).
values_special(Type, N) ->
    case lists:member(Type, ?FLOATS) andalso chance(0.3) of
        true -> [case chance(0.15) of true -> pick([nan, inf, ninf]); false -> value(Type) end
                 || _ <- lists:seq(1, N)];
        false -> values(Type, N)
    end.

encode(Type, Vs) -> << <<(enc(Type, V))/binary>> || V <- Vs >>.
enc({f, 32}, nan) -> <<16#7FC00000:32/native>>;
enc({f, 32}, inf) -> <<16#7F800000:32/native>>;
enc({f, 32}, ninf) -> <<16#FF800000:32/native>>;
enc({f, 64}, nan) -> <<16#7FF8000000000000:64/native>>;
enc({f, 64}, inf) -> <<16#7FF0000000000000:64/native>>;
enc({f, 64}, ninf) -> <<16#FFF0000000000000:64/native>>;
enc({_, 16}, nan) -> <<16#7FC0:16/native>>; % a NaN in bf16 and in f16
enc({bf, 16}, inf) -> <<16#7F80:16/native>>;
enc({bf, 16}, ninf) -> <<16#FF80:16/native>>;
enc({f, 16}, inf) -> <<16#7C00:16/native>>;
enc({f, 16}, ninf) -> <<16#FC00:16/native>>;
enc(Type, V) -> fusex_test_util:encode(Type, [V]).

dev() -> get(fuzz_device).
%% The float types the device computes in ({f,64} on the CPU only).
floats() -> case dev() of cpu -> ?FLOATS; _ -> ?FLOATS -- [{f, 64}] end.
t(Type, Shape, Vs) -> fusex:tensor(encode(Type, Vs), Type, Shape, #{device => dev()}).
tr(Shape, Vs) -> t({f, 64}, Shape, Vs). % f64, for the references
vals(T) -> fusex_test_util:values(T).

%% The values a tensor of Type holds for Vs (nan for one beyond its range:
%% an infinity, which decodes as nan too).
rounded(Type, Vs) -> [round1(Type, V) || V <- Vs].
round1(Type, V) ->
    try hd(fusex_test_util:decode(Type, enc(Type, V)))
    catch error:badarg -> nan
    end.

%% Frees tensors of NaN bytes near the sizes a valid case is about to
%% allocate, so that memory an op forgets to write reads as NaN.
poison_heap(Bytes) ->
    [fusex:free(fusex:tensor(binary:copy(<<255>>, max(1, B)), {u, 8}, {max(1, B)}, #{device => dev()}))
     || B <- Bytes, B < 1 bsl 20],
    ok.

%% ---- comparisons ----

%% Elementwise: within `Ulps' steps of Type's precision, relative.
eps({f, 32}) -> 1.2e-7;
eps({f, 64}) -> 2.3e-16;
eps({bf, 16}) -> 7.9e-3;
eps({f, 16}) -> 9.8e-4;
eps(_) -> 0.

close_each(Type, Got, Want) -> close_each(Type, Got, Want, 1).
close_each(Type, Got, Want, Ulps) when length(Got) =:= length(Want) ->
    Bad = [{I, G, W} || {I, G, W} <- lists:zip3(lists:seq(1, length(Got)), Got, Want),
                        not elem_close(Type, G, W, Ulps)],
    case Bad of [] -> ok; _ -> {fail, {values_differ, Type, lists:sublist(Bad, 5)}} end;
close_each(_, Got, Want, _) -> {fail, {lengths_differ, length(Got), length(Want)}}.

elem_close(_, G, W, _) when is_integer(G), is_integer(W) -> G =:= W;
elem_close(_, nan, nan, _) -> true; % both not finite (decode gives nan for NaN and Inf)
elem_close(Type, G, W, Ulps) when is_number(G), is_number(W) ->
    abs(G - W) =< Ulps * eps(Type) * abs(W) + min_normal(Type);
elem_close(_, _, _, _) -> false.

min_normal({f, 16}) -> 6.0e-8;
min_normal({bf, 16}) -> 1.0e-38;
min_normal({f, 32}) -> 1.0e-38;
min_normal(_) -> 1.0e-300.

%% rel-L2 as the other suites measure it (NaN never passes).
%% A result whose terms nearly cancel (a small reference from unit-scale
%% inputs) also passes within f32's rounding of those terms, 1e-6 an element
%% (the C suites' rule): the CPU fast path accumulates in f32, as CUDA does.
%% f64 results (the oracle's) get no such slack.
close_l2(Got, Want, Tol) ->
    case fusex_test_util:rel_l2(Got, Want) of
        E when is_float(E), E =< Tol -> ok;
        E when is_float(E), Tol >= 1.0e-5 ->
            case within_rounding(Got, Want, Tol) of
                true -> ok;
                false -> {fail, {rel_l2, E, tolerance, Tol}}
            end;
        E -> {fail, {rel_l2, E, tolerance, Tol}}
    end.

within_rounding(Got, Want, Tol) when length(Got) =:= length(Want), Want =/= [] ->
    Diff = math:sqrt(lists:sum([(G - W) * (G - W) || {G, W} <- lists:zip(Got, Want)])),
    Ref = math:sqrt(lists:sum([W * W || W <- Want])),
    Diff =< Tol * Ref + 1.0e-6 * math:sqrt(length(Want));
within_rounding(_, _, _) -> false.

all_ok(Checks) ->
    case [C || C <- Checks, C =/= ok] of [] -> ok; [First | _] -> First end.

%% ---- the cases ----

gen_case() ->
    Gen = weighted([{6, fun roundtrip/0}, {6, fun binop/0}, {3, fun scale/0}, {5, fun convert/0},
                    {4, fun reshape/0}, {4, fun copy_into/0}, {5, fun pointers/0},
                    {8, fun linrec_forward/0}, {5, fun linrec_backward/0}, {4, fun linrec_step/0},
                    {8, fun ssm_forward/0}, {5, fun ssm_backward/0}, {4, fun ssm_step/0},
                    {8, fun layer_forward/0}, {5, fun layer_backward/0}, {3, fun layer_step/0},
                    {3, fun layer_bad_input/0}, {6, fun mutated_layer/0},
                    {5, fun rnn_forward/0}, {3, fun rnn_backward/0}, {3, fun rnn_step/0},
                    {3, fun rnn_bad_input/0}, {4, fun mutated_rnn/0},
                    {6, fun optimizer/0}, {3, fun optimizer_misuse/0},
                    {5, fun freed_input/0}, {4, fun huge_empty/0}, {10, fun mutated_scan/0},
                    {3, fun nonfinite_scan/0}, {2, fun killed_call/0}, {20, fun junk_call/0}]),
    Gen().

%% -- tensors --

roundtrip() ->
    Type = pick(?TYPES), Shape = shape(), N = numel(Shape),
    Bin = encode(Type, values_special(Type, N)),
    Run = fun() ->
                  T = fusex:tensor(Bin, Type, Shape, #{device => dev()}),
                  Z = fusex:zeros(Type, Shape, #{device => dev()}),
                  {fusex:to_binary(T), fusex:shape(T), fusex:type(T), fusex:size(T), fusex:byte_size(T),
                   fusex:to_binary(fusex:copy(T, cpu)), fusex:to_binary(Z), fusex:device(T)}
          end,
    {_, Bits} = Type,
    Want = {Bin, Shape, Type, N, byte_size(Bin), Bin, binary:copy(<<0>>, N * Bits div 8), dev()},
    #{kind => roundtrip, desc => {tensor, Type, Shape}, run => Run, expect => valid,
      check => fun(Got) when Got =:= Want -> ok; (Got) -> {fail, {got, summary(Got)}} end}.

binop() ->
    Op = pick([add, subtract, multiply]), Type = pick(?TYPES), Shape = shape(), N = numel(Shape),
    As = values(Type, N), Bs = values(Type, N),
    case chance(0.8) of
        true ->
            Run = fun() -> poison_heap([N * 8]),
                           vals(fusex:Op(t(Type, Shape, As), t(Type, Shape, Bs))) end,
            Want = [binop_ref(Op, Type, A, B) || {A, B} <- lists:zip(rounded(Type, As), rounded(Type, Bs))],
            #{kind => binop, desc => {Op, Type, Shape}, run => Run, expect => valid,
              check => fun(Got) -> close_each(Type, Got, Want) end};
        false -> % b of another type or shape
            {TypeB, ShapeB} = case chance(0.5) of
                                  true -> {pick(?TYPES -- [Type]), Shape};
                                  false -> {Type, other_shape(Shape)}
                              end,
            Run = fun() -> fusex:Op(t(Type, Shape, As), t(TypeB, ShapeB, values(TypeB, numel(ShapeB)))) end,
            #{kind => binop, desc => {Op, Type, Shape, TypeB, ShapeB}, run => Run, expect => error,
              arg => <<"b">>}
    end.

other_shape(Shape) ->
    case tuple_to_list(Shape) of
        [] -> {1, 1};
        [D | Rest] -> list_to_tuple([D + 1 | Rest])
    end.

binop_ref(Op, Type, A, B) when is_integer(A) ->
    V = case Op of add -> A + B; subtract -> A - B; multiply -> A * B end,
    wrap(Type, V);
binop_ref(Op, Type, A, B) ->
    V = case Op of add -> A + B; subtract -> A - B; multiply -> A * B end,
    hd(rounded(Type, [V])).

wrap({u, 8}, V) -> V band 255;
wrap({s, 32}, V) -> <<W:32/signed>> = <<V:32>>, W;
wrap({s, 64}, V) -> <<W:64/signed>> = <<V:64>>, W.

scale() ->
    Type = pick(?TYPES), Shape = shape(), N = numel(Shape), Vs = values(Type, N),
    Factor = weighted([{6, rand:normal() * 4}, {2, ri(9) - 5}, {1, 1 bsl (63 + ri(10))}, {1, two}]),
    Valid = lists:member(Type, ?FLOATS) andalso is_number(Factor) andalso abs(Factor) < 1 bsl 63,
    Run = fun() -> poison_heap([N * 8]), vals(fusex:scale(t(Type, Shape, Vs), Factor)) end,
    case Valid of
        true ->
            Want = [scale_ref(Type, V, Factor) || V <- rounded(Type, Vs)],
            #{kind => scale, desc => {scale, Type, Shape, Factor}, run => Run, expect => valid,
              check => fun(Got) -> close_each(Type, Got, Want) end};
        false ->
            #{kind => scale, desc => {scale, Type, Shape, Factor}, run => Run, expect => error}
    end.

%% f32 arithmetic for the 16- and 32-bit types, f64 for f64 (as documented).
scale_ref({f, 64}, V, F) -> V * F;
scale_ref(Type, V, F) -> hd(rounded(Type, [r32(r32(V) * r32(F))])).

r32(V) -> <<X:32/float>> = <<V:32/float>>, X.

convert() ->
    From = pick(?TYPES), To = pick(?TYPES), Shape = shape(), N = numel(Shape),
    Vs = values_special(From, N),
    Run = fun() -> poison_heap([N * 8]), vals(fusex:convert(t(From, Shape, Vs), To)) end,
    Want = [convert_ref(To, V) || V <- decoded(From, Vs)],
    #{kind => convert, desc => {convert, From, To, Shape}, run => Run, expect => valid,
      check => fun(Got) -> close_each(To, Got, Want) end}.

%% What a tensor of From holds for Vs, NaN and infinities as atoms.
decoded(From, Vs) -> [case V of nan -> nan; inf -> inf; ninf -> ninf; _ -> hd(rounded(From, [V])) end || V <- Vs].

%% Through f64, as the CPU (the reference device) converts: floats round
%% to nearest even, integers truncate toward zero, saturate, NaN is 0.
convert_ref(To, V) when To =:= {s, 32}; To =:= {s, 64}; To =:= {u, 8} ->
    {Lo, Hi} = case To of
                   {s, 32} -> {-2147483648, 2147483647};
                   {s, 64} -> {-9223372036854775808, 9223372036854774784};
                   {u, 8} -> {0, 255}
               end,
    case V of
        nan -> 0;
        inf -> Hi;
        ninf -> Lo;
        _ -> F = float(V), if F =< Lo -> Lo; F >= Hi -> Hi; true -> trunc(F) end
    end;
convert_ref(_, V) when is_atom(V) -> nan; % decodes as nan (not finite)
convert_ref(To, V) -> hd(rounded(To, [float(V)])).

reshape() ->
    Type = pick(?TYPES), Shape = shape(), N = numel(Shape), Vs = values(Type, N),
    case chance(0.75) of
        true ->
            New = refactor(N),
            Run = fun() -> T = t(Type, Shape, Vs), R = fusex:reshape(T, New), {fusex:shape(R), vals(R)} end,
            Want = {New, rounded(Type, Vs)},
            #{kind => reshape, desc => {reshape, Shape, New}, run => Run, expect => valid,
              check => fun({S, Got}) when S =:= New -> close_each(Type, Got, element(2, Want));
                          (Got) -> {fail, {got, Got}} end};
        false ->
            New = list_to_tuple([dim() || _ <- lists:seq(1, ri(4))]),
            Run = fun() -> fusex:reshape(t(Type, Shape, Vs), New) end,
            Expect = case numel(New) =:= N of true -> any; false -> error end,
            #{kind => reshape, desc => {reshape, Shape, New}, run => Run, expect => Expect}
    end.

%% A random shape of N elements.
refactor(0) -> list_to_tuple(shuffle([0 | [dim() || _ <- lists:seq(1, ri(3) - 1)]]));
refactor(N) -> list_to_tuple(shuffle(factors(N, []))).
factors(1, Acc) -> case chance(0.3) of true -> [1 | Acc]; false -> Acc end;
factors(N, Acc) ->
    P = hd([D || D <- lists:seq(2, N), N rem D =:= 0]),
    factors(N div P, [P | Acc]).
shuffle(L) -> [X || {_, X} <- lists:sort([{u(), X} || X <- L])].

%% copy_into between tensors, and between views of one memory at offsets
%% (memmove semantics).
copy_into() ->
    Type = pick(?TYPES), {_, Bits} = Type, Bytes = Bits div 8,
    case dev() =:= cpu andalso chance(0.5) of
        false ->
            Shape = shape(), N = numel(Shape), Vs = values(Type, N),
            Run = fun() -> S = t(Type, Shape, Vs), D = fusex:zeros(Type, Shape, #{device => dev()}),
                           ok = fusex:copy_into(S, D), vals(D) end,
            #{kind => copy_into, desc => {copy_into, Type, Shape}, run => Run, expect => valid,
              check => fun(Got) -> close_each(Type, Got, rounded(Type, Vs)) end};
        true ->
            N = ri(40), Len = ri(N), Src = ri(N - Len + 1) - 1, Dst = ri(N - Len + 1) - 1,
            Vs = values(Type, N),
            Run = fun() ->
                          T = t(Type, {N}, Vs),
                          {local, A, _} = fusex:to_pointer(T, local),
                          View = fun(At) -> fusex:from_pointer({local, A + At * Bytes}, Type, {Len},
                                                              #{device => cpu}) end,
                          ok = fusex:copy_into(View(Src), View(Dst)),
                          vals(T)
                  end,
            R = rounded(Type, Vs),
            Want = lists:sublist(R, Dst) ++ lists:sublist(R, Src + 1, Len) ++ lists:nthtail(Dst + Len, R),
            #{kind => copy_into, desc => {copy_into_views, Type, N, Len, Src, Dst}, run => Run, expect => valid,
              check => fun(Got) -> close_each(Type, Got, Want) end}
    end.

%% from_pointer over live tensors (inside: a view; past the end: refused),
%% just freed ones (refused), null and misaligned addresses.
pointers() ->
    Type = pick(?TYPES), {_, Bits} = Type, Bytes = Bits div 8, N = ri(32), Vs = values(Type, N),
    Mode = pick([inside, past_end, freed, null, misaligned]),
    Len = ri(N), Off = ri(N - Len + 1) - 1,
    Run = fun() ->
                  T = t(Type, {N}, Vs),
                  {local, A, Size} = fusex:to_pointer(T, local),
                  {Shape, Ptr} =
                      case Mode of
                          inside -> {{Len}, {local, A + Off * Bytes}};
                          past_end -> {{N - Off + 1}, {local, A + Off * Bytes}};
                          freed -> ok = fusex:free(T), {{Len}, {local, A, Size}};
                          null -> {{Len}, {local, 0}};
                          misaligned when Bytes > 1 -> {{1}, {local, A + 1}};
                          misaligned -> {{Len}, {local, 0}}
                      end,
                  V = fusex:from_pointer(Ptr, Type, Shape, #{device => dev()}),
                  Got = vals(V),
                  _ = fusex_nif:is_live(T), % T stays referenced (not collected) until the view is read
                  Got
          end,
    case Mode of
        inside ->
            #{kind => pointers, desc => {from_pointer, Mode, Type, N, Off, Len}, run => Run, expect => valid,
              check => fun(Got) -> close_each(Type, Got, lists:sublist(rounded(Type, Vs), Off + 1, Len)) end};
        _ ->
            #{kind => pointers, desc => {from_pointer, Mode, Type, N, Off, Len}, run => Run, expect => error,
              arg => <<"pointer">>}
    end.

%% -- linear recurrences --

-define(LINREC, [linear_scan, mingru, minlstm, liquid]).

seq_names(linear_scan) -> [a, b];
seq_names(mingru) -> [z_logits, cand];
seq_names(minlstm) -> [f_logits, i_logits, cand];
seq_names(liquid) -> [f_logits].

%% A random problem: #{op, dims, type, seq => [values], tau, a, dt, opts}.
linrec_problem(Type) -> linrec_problem(Type, dim()).
linrec_problem(Type, L) ->
    Op = pick(?LINREC), B = dim(), H = dim(), N = B * L * H,
    Seq = [case {Op, K} of
               {linear_scan, 1} -> [range(-1.0, 1.0) || _ <- lists:seq(1, N)]; % |a| < 1
               _ -> [rand:normal() || _ <- lists:seq(1, N)]
           end || K <- lists:seq(1, length(seq_names(Op)))],
    Opts0 = maps:from_list(
              [{reverse, true} || chance(0.3)] ++ [{return_state, true} || chance(0.5)] ++
              [{h0, h0} || chance(0.4)] ++
              [{candidate_activation, pick([g, identity])} || lists:member(Op, [mingru, minlstm]), chance(0.5)] ++
              [{dt, case chance(0.5) of true -> range(0.05, 2.0); false -> tensor end}
               || Op =:= liquid, chance(0.7)]),
    #{op => Op, dims => {B, L, H}, type => Type, seq => Seq,
      tau => [range(0.3, 2.0) || _ <- lists:seq(1, H)], a => [rand:normal() || _ <- lists:seq(1, H)],
      dt_list => [range(0.05, 1.5) || _ <- lists:seq(1, B * L)],
      h0 => [rand:normal() || _ <- lists:seq(1, B * H)], opts => Opts0}.

%% The problem rounded to its type (what the device sees).
linrec_rounded(P = #{type := Type}) ->
    R = fun(Vs) -> rounded(Type, Vs) end,
    P#{seq := [R(S) || S <- maps:get(seq, P)], tau := R(maps:get(tau, P)), a := R(maps:get(a, P)),
       dt_list := R(maps:get(dt_list, P)), h0 := R(maps:get(h0, P))}.

%% Tensors and call arguments of a problem: {Args, Opts}.
linrec_args(#{op := Op, dims := {B, L, H}, type := Type, seq := Seq, opts := Opts0} = P, Mk) ->
    Seqs = [Mk(Type, {B, L, H}, S) || S <- Seq],
    Params = case Op of liquid -> [Mk(Type, {H}, maps:get(tau, P)), Mk(Type, {H}, maps:get(a, P))]; _ -> [] end,
    Opts = maps:map(fun(h0, h0) -> Mk(Type, {B, H}, maps:get(h0, P));
                       (dt, tensor) -> Mk(Type, {B, L, 1}, maps:get(dt_list, P));
                       (_, V) -> V
                    end, Opts0),
    {Seqs ++ Params, Opts}.


%% {H, State} of the reference, f64, flat.
linrec_ref(#{op := Op, dims := Dims, opts := Opts} = P) ->
    fusex_test_util:linrec_reference(Op, Dims, maps:with([seq, tau, a, dt_list, h0], P), Opts).

tol({f, 64}) -> 1.0e-10;
tol({f, 32}) -> 1.0e-5;
tol(_) -> 1.0e-2.

linrec_forward() ->
    Type = pick(floats()),
    P = linrec_rounded(linrec_problem(Type)),
    #{op := Op, dims := {B, L, H}, opts := Opts0} = P,
    Run = fun() ->
                  {Args, Opts} = linrec_args(P, fun t/3),
                  poison_heap([B * L * H * 8, B * H * 8]),
                  case apply(fusex, Op, Args ++ [Opts]) of
                      {Ht, St} -> {vals(Ht), vals(St)};
                      Ht -> {vals(Ht), none}
                  end
          end,
    {WantH, WantS} = linrec_ref(P),
    StateType = case Type of {f, 64} -> {f, 64}; _ -> {f, 32} end,
    Check = fun({GotH, GotS}) ->
                    all_ok([close_l2(GotH, rounded(Type, WantH), tol(Type)),
                            case GotS of none -> ok; _ -> close_l2(GotS, rounded(StateType, WantS), tol(Type)) end])
            end,
    #{kind => linrec_forward, desc => {Op, Type, {B, L, H}, maps:keys(Opts0)}, run => Run, expect => valid,
      check => Check}.

%% Gradients against central differences of the forward, in f64 on the
%% CPU: along a random direction V, (L(x + eV) - L(x - eV)) / 2e against
%% <grad, V>, with L = <W, H> (+ <Ws, State>).
linrec_backward() ->
    put(fuzz_device, cpu),
    P0 = linrec_problem({f, 64}),
    #{op := Op, dims := {B, L, H}, opts := Opts0} = P0,
    P = P0#{opts := maps:remove(return_state, Opts0)},
    W = [rand:normal() || _ <- lists:seq(1, B * L * H)],
    Ws = [rand:normal() || _ <- lists:seq(1, B * H)],
    UseDstate = chance(0.5),
    Diff = linrec_diff_keys(P),
    Dir = maps:from_list([{K, [rand:normal() || _ <- linrec_get(K, P)]} || K <- Diff]),
    Loss = fun(Q) ->
                   {Args, Opts} = linrec_args(Q, fun t/3),
                   {Ht, St} = apply(fusex, Op, Args ++ [Opts#{return_state => true}]),
                   dot(W, vals(Ht)) + case UseDstate of true -> dot(Ws, vals(St)); false -> 0 end
           end,
    Run = fun() ->
                  {Args, Opts} = linrec_args(P, fun t/3),
                  {_, Ctx} = apply(fusex, Op, Args ++ [Opts#{save_for_backward => true}]),
                  poison_heap([B * L * H * 8, B * L * 8, H * 8, B * H * 8]),
                  Back = list_to_atom(atom_to_list(Op) ++ "_backward"),
                  BOpts = case UseDstate of true -> #{dstate => tr({B, H}, Ws)}; false -> #{} end,
                  Grads = fusex:Back(tr({B, L, H}, W), Ctx, BOpts),
                  An = lists:sum([dot(vals(maps:get(grad_key(Op, K), Grads)), maps:get(K, Dir)) || K <- Diff]),
                  Eps = 1.0e-6,
                  Fd = (Loss(linrec_step_along(P, Dir, Eps)) - Loss(linrec_step_along(P, Dir, -Eps))) / (2 * Eps),
                  {lists:sort(maps:keys(Grads)), An, Fd, Loss(P)}
          end,
    WantKeys = lists:sort([grad_key(Op, K) || K <- linrec_grad_inputs(P)]),
    Check = fun({Keys, An, Fd, L0}) when Keys =:= WantKeys ->
                    fd_close(An, Fd, L0);
               ({Keys, _, _, _}) -> {fail, {gradient_keys, Keys, expected, WantKeys}}
            end,
    #{kind => linrec_backward, desc => {Op, {B, L, H}, maps:keys(Opts0), UseDstate}, run => Run,
      expect => valid, check => Check}.

fd_close(An, Fd, L0) when is_number(An), is_number(Fd) ->
    case abs(An - Fd) =< 1.0e-6 * (1 + abs(An) + abs(Fd) + abs(L0)) of
        true -> ok;
        false -> {fail, {gradient, analytic, An, central_difference, Fd}}
    end;
fd_close(An, Fd, _) -> {fail, {gradient, analytic, An, central_difference, Fd}}.

%% A NaN or an infinity (decoded as the atom nan) fails the case, saying so.
dot(A, B) ->
    case lists:all(fun is_number/1, A ++ B) of
        true -> lists:sum([X * Y || {X, Y} <- lists:zip(A, B)]);
        false -> throw({not_finite, [V || V <- A ++ B, not is_number(V)], lists:sublist(B, 6)})
    end.

%% The inputs a linrec backward returns a gradient for, and those among
%% them the check moves (all).
linrec_grad_inputs(#{op := Op, opts := Opts}) ->
    [{seq, I} || I <- lists:seq(1, length(seq_names(Op)))] ++
        [K || Op =:= liquid, K <- [tau, a]] ++
        [dt || Op =:= liquid, maps:get(dt, Opts, 1.0) =:= tensor] ++
        [h0 || maps:is_key(h0, Opts)].
linrec_diff_keys(P) -> linrec_grad_inputs(P).

grad_key(Op, {seq, I}) -> lists:nth(I, seq_names(Op));
grad_key(_, K) -> K.

linrec_get({seq, I}, P) -> lists:nth(I, maps:get(seq, P));
linrec_get(dt, P) -> maps:get(dt_list, P);
linrec_get(K, P) -> maps:get(K, P).

linrec_step_along(P, Dir, E) ->
    maps:fold(fun({seq, I}, V, Q) ->
                      Seq = maps:get(seq, Q),
                      New = lists:sublist(Seq, I - 1) ++ [axpy(E, V, lists:nth(I, Seq))] ++ lists:nthtail(I, Seq),
                      Q#{seq := New};
                 (dt, V, Q) -> Q#{dt_list := axpy(E, V, maps:get(dt_list, Q))};
                 (K, V, Q) -> Q#{K := axpy(E, V, maps:get(K, Q))}
              end, P, Dir).

axpy(E, V, X) -> [Xi + E * Vi || {Xi, Vi} <- lists:zip(X, V)].

%% One frame against the reference's first step from the given state.
linrec_step() ->
    Type = pick(floats()),
    P0 = linrec_rounded(linrec_problem(Type, 1)),
    #{op := Op, dims := {B, _, H}, opts := Opts0} = P0,
    Frame = fun(Vs) -> lists:sublist(Vs, B * H) end,
    P = P0#{dims := {B, 1, H}, seq := [Frame(S) || S <- maps:get(seq, P0)],
            dt_list := lists:sublist(maps:get(dt_list, P0), B),
            opts := maps:with([candidate_activation, dt, h0], Opts0#{h0 => h0})},
    StateType = pick([Type, case Type of {f, 64} -> {f, 64}; _ -> {f, 32} end]),
    State0 = rounded(StateType, maps:get(h0, P)),
    Run = fun() ->
                  {Args0, Opts} = linrec_args(P, fun t/3),
                  Args = [fusex:reshape(A, {B, H}) || A <- lists:sublist(Args0, length(seq_names(Op)))] ++
                         lists:nthtail(length(seq_names(Op)), Args0),
                  StepOpts = maps:map(fun(dt, T) when is_reference(T) -> fusex:reshape(T, {B, 1}); (_, V) -> V end,
                                      maps:remove(h0, Opts)),
                  S = t(StateType, {B, H}, State0),
                  Step = list_to_atom(atom_to_list(Op) ++ "_step"),
                  Hn = apply(fusex, Step, [S | Args] ++ [StepOpts]),
                  {vals(Hn), vals(S)}
          end,
    {WantH, _} = linrec_ref(P#{h0 := State0}),
    Check = fun({GotH, GotS}) ->
                    all_ok([close_l2(GotH, rounded(Type, WantH), tol(Type)),
                            close_l2(GotS, rounded(StateType, WantH), tol(Type))])
            end,
    #{kind => linrec_step, desc => {Op, Type, StateType, {B, H}}, run => Run, expect => valid, check => Check}.

%% -- the selective scan --

%% #{dims := {B, L, D, N, G}, x, dt, a, b, c, and the options' values}.
ssm_problem(Type) -> ssm_problem(Type, dim()).
ssm_problem(Type, L) ->
    B = dim(), D = dim(), N = pos_dim(),
    G = case D of 0 -> pick([1, 2]); _ -> pick([G1 || G1 <- lists:seq(1, D), D rem G1 =:= 0]) end,
    R = fun(K) -> rounded(Type, K) end,
    Opts = [K || K <- [d, z, dt_bias, h0, dt_softplus, rank4], chance(0.4)],
    Softplus = lists:member(dt_softplus, Opts),
    In = #{dims => {B, L, D, N, G}, type => Type, opts => Opts,
           x => R([rand:normal() || _ <- lists:seq(1, B * L * D)]),
           dt => R([case Softplus of true -> range(-3.0, 1.0); false -> range(0.01, 0.6) end
                    || _ <- lists:seq(1, B * L * D)]),
           a => R([range(-2.0, -0.1) || _ <- lists:seq(1, D * N)]),
           b => R([rand:normal() || _ <- lists:seq(1, B * L * G * N)]),
           c => R([rand:normal() || _ <- lists:seq(1, B * L * G * N)]),
           d => R([rand:normal() || _ <- lists:seq(1, D)]),
           z => R([rand:normal() || _ <- lists:seq(1, B * L * D)]),
           dt_bias => R([range(0.0, 0.3) || _ <- lists:seq(1, D)]),
           h0 => R([rand:normal() || _ <- lists:seq(1, B * D * N)])},
    In.

ssm_shape(K, #{dims := {B, L, D, N, G}, opts := Opts}) ->
    case K of
        x -> {B, L, D}; dt -> {B, L, D}; z -> {B, L, D};
        a -> {D, N};
        _ when K =:= b; K =:= c ->
            case G > 1 orelse lists:member(rank4, Opts) of true -> {B, L, G, N}; false -> {B, L, N} end;
        d -> {D}; dt_bias -> {D};
        h0 -> {B, D, N}
    end.

ssm_has(K, #{opts := Opts}) -> lists:member(K, Opts).

ssm_args(In = #{type := Type}, Extra) ->
    T = fun(K) -> t(Type, ssm_shape(K, In), maps:get(K, In)) end,
    Opts = maps:from_list([{K, T(K)} || K <- [d, z, dt_bias, h0], ssm_has(K, In)] ++
                              [{dt_softplus, true} || ssm_has(dt_softplus, In)]),
    {[T(x), T(dt), T(a), T(b), T(c)], maps:merge(Opts, Extra)}.

%% {Ys, State}, straight from the equations (include/fusex_ssm.h).
ssm_ref(In = #{dims := Dims, opts := Opts}) -> fusex_test_util:ssm_reference(Dims, In, Opts).

ssm_forward() ->
    Type = pick(floats()),
    In = ssm_problem(Type),
    #{dims := {B, L, D, N, _} = Dims, opts := Opts} = In,
    WantState = chance(0.5),
    Run = fun() ->
                  {Args, O} = ssm_args(In, #{return_state => WantState}),
                  poison_heap([B * L * D * 8, B * D * N * 8]),
                  case apply(fusex, selective_scan, Args ++ [O]) of
                      {Y, S} -> {vals(Y), vals(S)};
                      Y -> {vals(Y), none}
                  end
          end,
    {WantY, WantS} = ssm_ref(In),
    StateType = case Type of {f, 64} -> {f, 64}; _ -> {f, 32} end,
    Check = fun({GotY, GotS}) ->
                    all_ok([close_l2(GotY, rounded(Type, WantY), ssm_tol(Type)),
                            case GotS of none -> ok; _ -> close_l2(GotS, rounded(StateType, WantS), ssm_tol(Type)) end])
            end,
    #{kind => ssm_forward, desc => {selective_scan, Type, Dims, Opts, WantState}, run => Run, expect => valid,
      check => Check}.

ssm_tol({f, 64}) -> 1.0e-10;
ssm_tol({f, 32}) -> 1.0e-5;
ssm_tol(_) -> 2.0e-2.

%% The backward along a random direction, in f64 on the CPU.
ssm_backward() ->
    put(fuzz_device, cpu),
    In = ssm_problem({f, 64}),
    #{dims := {B, L, D, N, _} = Dims, opts := Opts} = In,
    W = [rand:normal() || _ <- lists:seq(1, B * L * D)],
    Ws = [rand:normal() || _ <- lists:seq(1, B * D * N)],
    UseDstate = chance(0.5),
    Keys = [x, dt, a, b, c] ++ [K || K <- [d, z, dt_bias, h0], ssm_has(K, In)],
    Dir = maps:from_list([{K, [rand:normal() * 0.5 || _ <- maps:get(K, In)]} || K <- Keys]),
    Loss = fun(Q) ->
                   {Args, O} = ssm_args(Q, #{return_state => true}),
                   {Y, S} = apply(fusex, selective_scan, Args ++ [O]),
                   dot(W, vals(Y)) + case UseDstate of true -> dot(Ws, vals(S)); false -> 0 end
           end,
    Along = fun(E) -> maps:fold(fun(K, V, Q) -> Q#{K := axpy(E, V, maps:get(K, Q))} end, In, Dir) end,
    Run = fun() ->
                  {Args, O} = ssm_args(In, #{save_for_backward => true}),
                  {_, Ctx} = apply(fusex, selective_scan, Args ++ [O]),
                  BOpts = case UseDstate of true -> #{dstate => tr({B, D, N}, Ws)}; false -> #{} end,
                  poison_heap([B * L * D * 8, D * N * 8]),
                  G = fusex:selective_scan_backward(tr({B, L, D}, W), Ctx, BOpts),
                  An = lists:sum([dot(vals(maps:get(K, G)), maps:get(K, Dir)) || K <- Keys]),
                  Eps = 1.0e-6,
                  Fd = (Loss(Along(Eps)) - Loss(Along(-Eps))) / (2 * Eps),
                  {lists:sort(maps:keys(G)), An, Fd, Loss(In)}
          end,
    Check = fun({GotKeys, An, Fd, L0}) ->
                    case GotKeys =:= lists:sort(Keys) of
                        true -> fd_close(An, Fd, L0);
                        false -> {fail, {gradient_keys, GotKeys, expected, lists:sort(Keys)}}
                    end
            end,
    #{kind => ssm_backward, desc => {selective_scan_backward, Dims, Opts, UseDstate}, run => Run,
      expect => valid, check => Check}.

%% One step against a one-step scan from the same state.
ssm_step() ->
    Type = pick(floats()),
    In0 = ssm_problem(Type, 1),
    #{dims := {B, _, D, N, G}} = In0,
    In = (maps:map(fun(K, V) when K =:= x; K =:= dt; K =:= z -> lists:sublist(V, B * D);
                      (K, V) when K =:= b; K =:= c -> lists:sublist(V, B * G * N);
                      (_, V) -> V
                   end, In0))#{dims := {B, 1, D, N, G}, opts := maps:get(opts, In0) -- [rank4]},
    StateType = case Type of {f, 64} -> pick([{f, 64}, {f, 32}]); _ -> {f, 32} end,
    State0 = rounded(StateType, maps:get(h0, In)),
    Run = fun() ->
                  Tt = fun(K, Shape) -> t(Type, Shape, maps:get(K, In)) end,
                  Bc = case G > 1 of true -> {B, G, N}; false -> {B, N} end,
                  O = maps:from_list([{d, Tt(d, {D})} || ssm_has(d, In)] ++ [{z, Tt(z, {B, D})} || ssm_has(z, In)] ++
                                         [{dt_bias, Tt(dt_bias, {D})} || ssm_has(dt_bias, In)] ++
                                         [{dt_softplus, true} || ssm_has(dt_softplus, In)]),
                  S = t(StateType, {B, D, N}, State0),
                  Y = fusex:selective_scan_step(S, Tt(x, {B, D}), Tt(dt, {B, D}), Tt(a, {D, N}), Tt(b, Bc),
                                                Tt(c, Bc), O),
                  {vals(Y), vals(S)}
          end,
    {WantY, WantS} = ssm_ref(In#{h0 := State0, opts := [h0 | maps:get(opts, In) -- [h0]]}),
    Check = fun({GotY, GotS}) ->
                    all_ok([close_l2(GotY, rounded(Type, WantY), ssm_tol(Type)),
                            close_l2(GotS, rounded(StateType, WantS), ssm_tol(Type))])
            end,
    #{kind => ssm_step, desc => {selective_scan_step, Type, StateType, {B, D, N, G}}, run => Run,
      expect => valid, check => Check}.

%% -- optimizers --

optimizer() ->
    Kind = pick([adamw, sgd]), NP = ri(3), Shapes = [shape() || _ <- lists:seq(1, NP)],
    P0 = [rounded({f, 32}, values({f, 32}, numel(S))) || S <- Shapes],
    Steps = ri(3),
    Grads = [[rounded({f, 32}, grad_values(numel(S))) || S <- Shapes] || _ <- lists:seq(1, Steps)],
    H = hyper(Kind),
    Run = fun() ->
                  Ps = [t({f, 32}, S, V) || {S, V} <- lists:zip(Shapes, P0)],
                  St = init(Kind, Ps, H),
                  Infos = [begin
                               Gs = [t({f, 32}, S, V) || {S, V} <- lists:zip(Shapes, G)],
                               step(Kind, St, Ps, Gs),
                               fusex:optimizer_info(St)
                           end || G <- Grads],
                  {[vals(P) || P <- Ps], Infos}
          end,
    {WantP, WantInfo} = optim_ref(Kind, H, P0, Grads),
    Check = fun({GotP, Infos}) ->
                    ParamCheck = case WantP of
                                     nonfinite -> ok; % a NaN or an infinity flowed into the params
                                     _ -> close_l2(lists:append(GotP), lists:append(WantP), 1.0e-5)
                                 end,
                    all_ok([ParamCheck | [info_close(G, W) || {G, W} <- lists:zip(Infos, WantInfo)]])
            end,
    #{kind => optimizer, desc => {Kind, Shapes, H, Steps}, run => Run, expect => valid, check => Check}.

init(adamw, Ps, H) -> fusex:adamw_init(Ps, H);
init(sgd, Ps, H) -> fusex:sgd_init(Ps, H).
step(adamw, St, Ps, Gs) -> fusex:adamw_step(St, Ps, Gs, #{});
step(sgd, St, Ps, Gs) -> fusex:sgd_step(St, Ps, Gs, #{}).

grad_values(N) ->
    case chance(0.1) of
        true -> [case chance(0.2) of true -> pick([nan, inf]); false -> rand:normal() end || _ <- lists:seq(1, N)];
        false -> [rand:normal() || _ <- lists:seq(1, N)]
    end.

hyper(adamw) ->
    maps:from_list([{lr, range(0.0, 0.1)} || chance(0.5)] ++ [{beta1, range(0.0, 0.99)} || chance(0.3)] ++
                       [{beta2, range(0.5, 0.999)} || chance(0.3)] ++ [{eps, range(1.0e-8, 1.0e-3)} || chance(0.3)] ++
                       [{weight_decay, range(0.0, 0.1)} || chance(0.4)] ++ [{maximize, true} || chance(0.2)] ++
                       [{amsgrad, true} || chance(0.3)] ++ [{max_grad_norm, range(0.1, 3.0)} || chance(0.3)] ++
                       [{skip_nonfinite, true} || chance(0.3)]);
hyper(sgd) ->
    Mom = case chance(0.6) of true -> range(0.0, 0.95); false -> 0.0 end,
    Nest = Mom > 0 andalso chance(0.3),
    maps:from_list([{lr, range(0.0, 0.1)} || chance(0.5)] ++ [{momentum, Mom} || Mom > 0] ++
                       [{dampening, range(0.0, 1.0)} || Mom > 0, not Nest, chance(0.4)] ++
                       [{nesterov, true} || Nest] ++ [{weight_decay, range(0.0, 0.1)} || chance(0.4)] ++
                       [{maximize, true} || chance(0.2)] ++ [{max_grad_norm, range(0.1, 3.0)} || chance(0.3)] ++
                       [{skip_nonfinite, true} || chance(0.3)]).

%% The formulas of docs/OPTIMIZERS.md, f64 between f32 stores.
optim_ref(Kind, H, P0, GradSteps) ->
    Dflt = case Kind of
               adamw -> #{lr => 1.0e-3, beta1 => 0.9, beta2 => 0.999, eps => 1.0e-8, weight_decay => 1.0e-2};
               sgd -> #{lr => 1.0e-3, momentum => 0.0, dampening => 0.0, weight_decay => 0.0}
           end,
    Hp = maps:merge(Dflt, H),
    Zero = [[0.0 || _ <- P] || P <- P0],
    {P, _, Infos, _, Flowed} =
        lists:foldl(
          fun(Gs, {Ps, Bufs, Acc, T, Fl}) ->
                  Flat = lists:append(Gs),
                  Bad = lists:any(fun is_atom/1, Flat),
                  Norm = case Bad of true -> nonfinite; false -> math:sqrt(lists:sum([G * G || G <- Flat])) end,
                  Prepass = maps:is_key(max_grad_norm, Hp) orelse maps:get(skip_nonfinite, Hp, false),
                  Skip = Bad andalso maps:get(skip_nonfinite, Hp, false),
                  NormOut = case Prepass of false -> undefined; true -> Norm end,
                  case {Skip, Bad} of
                      {true, _} -> {Ps, Bufs, Acc ++ [{T, true, NormOut}], T, Fl};
                      {false, true} -> {Ps, Bufs, Acc ++ [{T + 1, false, NormOut, nonfinite}], T + 1, true};
                      {false, false} ->
                          Factor = case maps:find(max_grad_norm, Hp) of
                                       {ok, M} -> min(1.0, M / (Norm + 1.0e-6));
                                       error -> 1.0
                                   end,
                          Sign = case maps:get(maximize, Hp, false) of true -> -1; false -> 1 end,
                          G2 = [[Sign * Factor * G || G <- Gl] || Gl <- Gs],
                          {Ps2, Bufs2} = optim_update(Kind, Hp, T + 1, Ps, G2, Bufs),
                          {Ps2, Bufs2, Acc ++ [{T + 1, false, NormOut}], T + 1, Fl}
                  end
          end, {P0, {Zero, Zero, Zero}, [], 0, false}, GradSteps),
    case Flowed of
        true -> {nonfinite, Infos};
        _ -> {P, Infos}
    end.

optim_update(adamw, H, T, Ps, Gs, {Ms, Vs, Mx}) ->
    #{lr := Lr, beta1 := B1, beta2 := B2, eps := Eps, weight_decay := Wd} = H,
    Ams = maps:get(amsgrad, H, false),
    Bc1 = 1 - math:pow(B1, T), Bc2 = 1 - math:pow(B2, T),
    Res = [unzip4(
             [begin
                  P1 = r32(P * (1 - Lr * Wd)),
                  M1 = r32(B1 * M + (1 - B1) * G),
                  V1 = r32(B2 * V + (1 - B2) * G * G),
                  X1 = case Ams of true -> r32(max(X, V1)); false -> X end,
                  Den = math:sqrt(case Ams of true -> X1; false -> V1 end) / math:sqrt(Bc2) + Eps,
                  {r32(P1 - (Lr / Bc1) * M1 / Den), M1, V1, X1}
              end || {P, G, M, V, X} <- zip5(Pl, Gl, Ml, Vl, Xl)])
           || {Pl, Gl, Ml, Vl, Xl} <- zip5(Ps, Gs, Ms, Vs, Mx)],
    {[P || {P, _, _, _} <- Res], {[M || {_, M, _, _} <- Res], [V || {_, _, V, _} <- Res], [X || {_, _, _, X} <- Res]}};
optim_update(sgd, H, T, Ps, Gs, {Bs, Z1, Z2}) ->
    #{lr := Lr, momentum := Mu, dampening := Damp, weight_decay := Wd} = H,
    Nest = maps:get(nesterov, H, false),
    Res = [lists:unzip(
             [begin
                  G1 = G + Wd * P,
                  {G2, B1} = case Mu > 0 of
                                 false -> {G1, B};
                                 true ->
                                     Bn = r32(case T of 1 -> G1; _ -> Mu * B + (1 - Damp) * G1 end),
                                     {case Nest of true -> G1 + Mu * Bn; false -> Bn end, Bn}
                             end,
                  {r32(P - Lr * G2), B1}
              end || {P, G, B} <- lists:zip3(Pl, Gl, Bl)])
           || {Pl, Gl, Bl} <- lists:zip3(Ps, Gs, Bs)],
    {[P || {P, _} <- Res], {[B || {_, B} <- Res], Z1, Z2}}.

unzip4(L) -> {[A || {A, _, _, _} <- L], [B || {_, B, _, _} <- L], [C || {_, _, C, _} <- L], [D || {_, _, _, D} <- L]}.

zip5([A | As], [B | Bs], [C | Cs], [D | Ds], [E | Es]) -> [{A, B, C, D, E} | zip5(As, Bs, Cs, Ds, Es)];
zip5([], [], [], [], []) -> [].

info_close(#{step := S, skipped := Sk, grad_norm := N}, {WS, WSk, WN}) ->
    case S =:= WS andalso Sk =:= WSk andalso norm_close(N, WN) of
        true -> ok;
        false -> {fail, {optimizer_info, #{step => S, skipped => Sk, grad_norm => N}, expected, {WS, WSk, WN}}}
    end;
info_close(#{step := S}, {WS, false, _, nonfinite}) when S =:= WS -> ok; % non-finite values flowed through
info_close(Got, Want) -> {fail, {optimizer_info, Got, expected, Want}}.

norm_close(undefined, undefined) -> true;
norm_close(N, nonfinite) -> N =:= infinity orelse N =:= nan;
norm_close(N, W) when is_float(N), is_float(W) -> abs(N - W) =< 1.0e-5 * (1 + W);
norm_close(_, _) -> false.

%% The state's own tensors handed back, forged maps, lists that do not
%% match: refused with badarg.
optimizer_misuse() ->
    Kind = pick([adamw, sgd]), Shapes = [{ri(4)} || _ <- lists:seq(1, ri(3))],
    Mode = pick([moment_as_grad, moment_as_param, forged_ref, short_list, wrong_shape, param_twice, view_overlap,
                 view_offset]),
    Run = fun() ->
                  Ps = [t({f, 32}, S, values({f, 32}, numel(S))) || S <- Shapes],
                  Gs = [t({f, 32}, S, values({f, 32}, numel(S))) || S <- Shapes],
                  St = init(Kind, Ps, case Kind of adamw -> #{}; sgd -> #{momentum => 0.9} end),
                  [M0 | _] = maps:get(case Kind of adamw -> exp_avg; sgd -> momentum_buffer end, St),
                  case Mode of
                      moment_as_grad -> step(Kind, St, Ps, [M0 | tl(Gs)]);
                      moment_as_param -> step(Kind, St, [M0 | tl(Ps)], Gs);
                      forged_ref -> step(Kind, St#{ref => hd(Ps)}, Ps, Gs);
                      short_list -> step(Kind, St, Ps, tl(Gs));
                      wrong_shape -> step(Kind, St, Ps, [t({f, 32}, {9}, values({f, 32}, 9)) | tl(Gs)]);
                      param_twice when length(Ps) > 1 -> step(Kind, St, [hd(Ps), hd(Ps) | tl(tl(Ps))], Gs);
                      param_twice -> step(Kind, St, [M0], Gs);
                      view_overlap ->
                          {local, A, _} = fusex:to_pointer(M0, local),
                          V = fusex:from_pointer({local, A}, {f, 32}, fusex:shape(hd(Gs)), #{device => dev()}),
                          step(Kind, St, Ps, [V | tl(Gs)]);
                      view_offset -> % a param over the tail of another
                          P4 = t({f, 32}, {4}, values({f, 32}, 4)),
                          {local, A, _} = fusex:to_pointer(P4, local),
                          Off = ri(3),
                          V = fusex:from_pointer({local, A + 4 * Off}, {f, 32}, {4 - Off}, #{device => dev()}),
                          init(Kind, shuffle([P4, V]), #{})
                  end
          end,
    #{kind => optimizer_misuse, desc => {Kind, Mode, Shapes}, run => Run, expect => error}.

%% -- the layers: causal conv1d, the norms, linear --

-define(LAYERS, [causal_conv1d, rms_norm, layer_norm, linear]).
-define(ACTIVATIONS, [none, relu, gelu, silu, tanh, sigmoid]).

%% A random valid problem of a layer op: #{op, type, dims, values (lists,
%% rounded to the type), given (the optional inputs passed), and the op's
%% other options}.
layer_problem(Type) -> layer_problem(pick(?LAYERS), Type).
layer_problem(causal_conv1d, Type) ->
    B = dim(), L = dim(), D = dim(), W = weighted([{4, ri(4)}, {1, ri(16)}]),
    R = fun(N) -> rounded(Type, [rand:normal() || _ <- lists:seq(1, N)]) end,
    #{op => causal_conv1d, type => Type, dims => {B, L, D, W}, act => pick([none, silu]),
      given => [K || K <- [bias, initial_state], chance(0.5)], return_state => chance(0.5),
      values => #{x => R(B * L * D), w => R(D * W), bias => R(D), initial_state => R(B * D * (W - 1))}};
layer_problem(Norm, Type) when Norm =:= rms_norm; Norm =:= layer_norm ->
    Shape = list_to_tuple([dim() || _ <- lists:seq(1, ri(3) - 1)] ++ [pos_dim()]),
    N = numel(Shape), H = element(tuple_size(Shape), Shape),
    ResType = pick([Type, {f, 32}]),
    Given = [bias || Norm =:= layer_norm orelse chance(0.5)] ++ [K || K <- [residual, gate], chance(0.5)],
    R = fun(T, M) -> rounded(T, [rand:normal() || _ <- lists:seq(1, M)]) end,
    #{op => Norm, type => Type, dims => Shape, res_type => ResType, given => Given,
      eps => pick([1.0e-5, 1.0e-3, 0.1]), residual_in_f32 => chance(0.3),
      values => #{x => R(Type, N), weight => R(Type, H), bias => R(Type, H), residual => R(ResType, N),
                  gate => R(Type, N)}};
layer_problem(linear, Type) ->
    In = pick([1, 2, 3, 5, 7, 33]), Out = dim(),
    XShape = list_to_tuple([dim() || _ <- lists:seq(1, ri(3) - 1)] ++ [In]),
    R = fun(M, S) -> rounded(Type, [S * rand:normal() || _ <- lists:seq(1, M)]) end,
    #{op => linear, type => Type, dims => XShape, out => Out, act => pick(?ACTIVATIONS),
      given => [bias || chance(0.5)],
      values => #{x => R(numel(XShape), 1.0), w => R(Out * In, 1 / math:sqrt(In)), bias => R(Out, 1.0)}}.

%% Each input's shape.
layer_shapes(#{op := causal_conv1d, dims := {B, L, D, W}}) ->
    #{x => {B, L, D}, w => {D, W}, bias => {D}, initial_state => {B, D, W - 1}};
layer_shapes(#{op := linear, dims := XShape, out := Out}) ->
    #{x => XShape, w => {Out, element(tuple_size(XShape), XShape)}, bias => {Out}};
layer_shapes(#{dims := Shape}) ->
    H = {element(tuple_size(Shape), Shape)},
    #{x => Shape, weight => H, bias => H, residual => Shape, gate => Shape}.

layer_type(#{res_type := R}, residual) -> R;
layer_type(#{type := T}, _) -> T.

%% The call's positional arguments and options, tensors made by Mk.
layer_args(P = #{op := Op, values := Vs, given := Given}, Mk) ->
    Shapes = layer_shapes(P),
    T = fun(K) -> Mk(layer_type(P, K), maps:get(K, Shapes), maps:get(K, Vs)) end,
    Opts = maps:from_list([{K, T(K)} || K <- Given, not (Op =:= layer_norm andalso K =:= bias)]),
    case Op of
        causal_conv1d ->
            {[T(x), T(w)], Opts#{activation => maps:get(act, P), return_state => maps:get(return_state, P)}};
        linear -> {[T(x), T(w)], Opts#{activation => maps:get(act, P)}};
        rms_norm -> {[T(x), T(weight)], norm_opts(P, Opts)};
        layer_norm -> {[T(x), T(weight), T(bias)], norm_opts(P, Opts)}
    end.

norm_opts(#{eps := Eps, residual_in_f32 := F32}, Opts) -> Opts#{eps => Eps, residual_in_f32 => F32}.

%% The reference's results: [Y] and the extra result (the final state, s)
%% where the call returns one.
layer_ref(P = #{op := causal_conv1d, dims := Dims, values := Vs, given := Given, act := Act}) ->
    {Y, F} = fusex_test_util:conv_reference(Dims, maps:with([x, w | Given], Vs), Act),
    case maps:get(return_state, P) of true -> [Y, F]; false -> [Y] end;
layer_ref(#{op := linear, dims := XShape, out := Out, values := Vs, given := Given, act := Act}) ->
    In = element(tuple_size(XShape), XShape),
    [fusex_test_util:linear_reference({numel(XShape) div In, In, Out}, maps:with([x, w | Given], Vs), Act)];
layer_ref(#{op := Norm, dims := Shape, values := Vs, given := Given, eps := Eps}) ->
    H = element(tuple_size(Shape), Shape),
    case fusex_test_util:norm_reference(Norm, {numel(Shape) div H, H}, maps:with([x, weight | Given], Vs), Eps) of
        {Y, none} -> [Y];
        {Y, S} -> [Y, S]
    end.

%% The types of the call's results, in the reference's order.
layer_result_types(P = #{op := Op, type := Type}) ->
    case Op of
        _ when Op =:= rms_norm; Op =:= layer_norm ->
            SType = case maps:get(residual_in_f32, P) of true -> {f, 32}; false -> maps:get(res_type, P) end,
            [Type | [SType || lists:member(residual, maps:get(given, P))]];
        _ -> [Type, Type]
    end.

layer_forward() ->
    Type = pick(floats()),
    P = layer_problem(Type),
    #{op := Op} = P,
    Run = fun() ->
                  {Args, Opts} = layer_args(P, fun t/3),
                  poison_heap([4096, 65536]),
                  case apply(fusex, Op, Args ++ [Opts]) of
                      {Y, E} -> [vals(Y), vals(E)];
                      Y -> [vals(Y)]
                  end
          end,
    Want = layer_ref(P),
    Check = fun(Got) when length(Got) =:= length(Want) ->
                    all_ok([close_l2(G, rounded(RT, W), tol(Type))
                            || {G, W, RT} <- lists:zip3(Got, Want, lists:sublist(layer_result_types(P), length(Got)))]);
               (Got) -> {fail, {results, length(Got), expected, length(Want)}}
            end,
    #{kind => layer_forward, desc => {Op, Type, maps:get(dims, P), maps:get(given, P)}, run => Run,
      expect => valid, check => Check}.

%% Gradients against central differences of the forward, in f64 on the
%% CPU, along a random direction (as linrec_backward): L = <Wy, Y> (+ <We,
%% the extra result> and its cotangent). No relu: a kink within the step
%% of a difference would fail a right gradient.
layer_backward() ->
    put(fuzz_device, cpu),
    P0 = layer_problem({f, 64}),
    %% the residual f64 and eps not too small: the differences resolve the
    %% forward's curvature at f64's precision
    P = case P0 of
            #{op := linear, act := relu} -> P0#{act := pick([gelu, tanh])};
            #{op := causal_conv1d} -> P0;
            #{op := linear} -> P0;
            _ -> P0#{res_type := {f, 64}, residual_in_f32 := false, eps := pick([1.0e-3, 0.1])}
        end,
    #{op := Op, values := Vs, given := Given} = P,
    Shapes = layer_shapes(P),
    Inputs = case Op of causal_conv1d -> [x, w]; linear -> [x, w]; _ -> [x, weight] end ++
        lists:usort(Given),
    Dir = maps:from_list([{K, [rand:normal() || _ <- maps:get(K, Vs)]} || K <- Inputs]),
    [YShape | ExtraShape] = case Op of
                                causal_conv1d -> [maps:get(x, Shapes) | [maps:get(initial_state, Shapes)
                                                                         || maps:get(return_state, P)]];
                                linear -> [setelement(tuple_size(maps:get(x, Shapes)), maps:get(x, Shapes),
                                                      maps:get(out, P))];
                                _ -> [maps:get(x, Shapes) | [maps:get(x, Shapes) || lists:member(residual, Given)]]
                            end,
    Wy = [rand:normal() || _ <- lists:seq(1, numel(YShape))],
    We = [[rand:normal() || _ <- lists:seq(1, numel(S))] || S <- ExtraShape],
    UseExtra = We =/= [] andalso chance(0.7),
    Loss = fun(Q) ->
                   {Args, Opts} = layer_args(Q, fun t/3),
                   case apply(fusex, Op, Args ++ [Opts]) of
                       {Y, E} when UseExtra -> dot(Wy, vals(Y)) + dot(hd(We), vals(E));
                       {Y, _} -> dot(Wy, vals(Y));
                       Y -> dot(Wy, vals(Y))
                   end
           end,
    Cotangent = #{causal_conv1d => dfinal_state, rms_norm => ds, layer_norm => ds},
    Run = fun() ->
                  {Args, Opts} = layer_args(P, fun t/3),
                  Out = apply(fusex, Op, Args ++ [Opts#{save_for_backward => true}]),
                  Ctx = element(tuple_size(Out), Out),
                  poison_heap([4096, 65536]),
                  BOpts = case UseExtra of
                              true -> #{maps:get(Op, Cotangent) => tr(hd(ExtraShape), hd(We))};
                              false -> #{}
                          end,
                  Back = list_to_atom(atom_to_list(Op) ++ "_backward"),
                  Grads = fusex:Back(tr(YShape, Wy), Ctx, BOpts),
                  An = lists:sum([dot(vals(maps:get(K, Grads)), maps:get(K, Dir)) || K <- Inputs]),
                  E = 1.0e-6,
                  Along = fun(S) -> P#{values := maps:map(fun(K, V) -> case Dir of
                                                                             #{K := Dv} -> axpy(S, Dv, V);
                                                                             _ -> V
                                                                         end end, Vs)} end,
                  Fd = (Loss(Along(E)) - Loss(Along(-E))) / (2 * E),
                  {lists:sort(maps:keys(Grads)), An, Fd, Loss(P)}
          end,
    WantKeys = lists:sort(Inputs),
    Check = fun({Keys, An, Fd, L0}) when Keys =:= WantKeys -> fd_close(An, Fd, L0);
               ({Keys, _, _, _}) -> {fail, {gradient_keys, Keys, expected, WantKeys}}
            end,
    #{kind => layer_backward, desc => {Op, maps:get(dims, P), Given, UseExtra}, run => Run, expect => valid,
      check => Check}.

%% One frame of causal_conv1d_step against the reference's first step from
%% the state.
layer_step() ->
    Type = pick(floats()),
    P0 = layer_problem(causal_conv1d, Type),
    #{dims := {B, _, D, W}, values := Vs, act := Act} = P0,
    P = P0#{dims := {B, 1, D, W}, values := Vs#{x := rounded(Type, [rand:normal() || _ <- lists:seq(1, B * D)])}},
    WithBias = chance(0.5),
    Run = fun() ->
                  S = t(Type, {B, D, W - 1}, maps:get(initial_state, Vs)),
                  Opts = maps:from_list([{bias, t(Type, {D}, maps:get(bias, Vs))} || WithBias] ++
                                        [{activation, Act}]),
                  Yt = fusex:causal_conv1d_step(S, t(Type, {B, D}, maps:get(x, maps:get(values, P))),
                                                t(Type, {D, W}, maps:get(w, Vs)), Opts),
                  {vals(Yt), vals(S)}
          end,
    {WantY, WantS} = fusex_test_util:conv_reference(
                       maps:get(dims, P), maps:with([x, w, initial_state | [bias || WithBias]], maps:get(values, P)),
                       Act),
    Check = fun({GotY, GotS}) ->
                    all_ok([close_l2(GotY, rounded(Type, WantY), tol(Type)), close_each(Type, GotS, WantS)])
            end,
    #{kind => layer_step, desc => {causal_conv1d_step, Type, {B, D, W}}, run => Run, expect => valid,
      check => Check}.

%% A valid layer call with one input of a wrong shape or type: refused,
%% naming it.
layer_bad_input() ->
    P = layer_problem({f, 32}),
    #{op := Op} = P,
    Shapes = layer_shapes(P),
    Wider = fun(Shape) -> setelement(tuple_size(Shape), Shape, element(tuple_size(Shape), Shape) + 1) end,
    Taller = fun(Shape) -> setelement(1, Shape, element(1, Shape) + 1) end,
    {K, Shape, Type} =
        case {Op, ri(3)} of
            {causal_conv1d, 1} -> {w, Taller(maps:get(w, Shapes)), {f, 32}};
            {causal_conv1d, 2} -> {bias, Wider(maps:get(bias, Shapes)), {f, 32}};
            {causal_conv1d, 3} -> {initial_state, Wider(maps:get(initial_state, Shapes)), {f, 32}};
            {linear, 1} -> {w, Wider(maps:get(w, Shapes)), {f, 32}};
            {linear, 2} -> {bias, Wider(maps:get(bias, Shapes)), {f, 32}};
            {linear, 3} -> {w, maps:get(w, Shapes), {f, 16}};
            {_, 1} -> {weight, Wider(maps:get(weight, Shapes)), {f, 32}};
            {_, 2} -> {residual, Wider(maps:get(residual, Shapes)), {f, 32}};
            {_, 3} -> {gate, maps:get(gate, Shapes), pick([{f, 16}, {s, 32}])}
        end,
    %% the input under test given (then replaced by the wrong one)
    Bad = P#{given := lists:usort([K || not lists:member(K, [x, w, weight])] ++ maps:get(given, P))},
    Run = fun() ->
                  {Args, Opts} = layer_args(Bad, fun t/3),
                  Wrong = t(Type, Shape, values(Type, numel(Shape))),
                  {Args2, Opts2} = put_input(Op, K, Wrong, Args, Opts),
                  apply(fusex, Op, Args2 ++ [Opts2])
          end,
    #{kind => layer_bad_input, desc => {Op, K, Shape, Type}, run => Run, expect => error, arg => atom_to_binary(K)}.

%% -- the GRU and the LSTM --

%% A stacked GRU or LSTM problem: shapes with zeros and ones, 1 to 3
%% layers, h0 and c0 given or not; values rounded to Type (h0, c0 f32 or
%% f64: the state type).
rnn_problem(Type) ->
    Cell = pick([gru, lstm]),
    Dims = {ri(4) - 1, weighted([{1, 0}, {6, ri(5)}]), ri(5), pick([1, 2, 3, ri(9)]), ri(3)},
    {B, L, I, H, NL} = Dims,
    G = case Cell of gru -> 3; lstm -> 4 end,
    S = 1 / math:sqrt(H),
    U = fun(N) -> rounded(Type, [S * (2 * u() - 1) || _ <- lists:seq(1, N)]) end,
    State = case Type of {f, 64} -> {f, 64}; _ -> {f, 32} end,
    #{cell => Cell, type => Type, state_type => State, dims => Dims,
      given => [K || K <- [h0, c0], chance(0.5), K =:= h0 orelse Cell =:= lstm],
      values => #{x => rounded(Type, [rand:normal() || _ <- lists:seq(1, B * L * I)]),
                  layers => [#{w_ih => U(G * H * case K of 1 -> I; _ -> H end), w_hh => U(G * H * H),
                               b_ih => U(G * H), b_hh => U(G * H)} || K <- lists:seq(1, NL)],
                  h0 => [0.5 * (2 * u() - 1) || _ <- lists:seq(1, NL * B * H)],
                  c0 => [0.5 * (2 * u() - 1) || _ <- lists:seq(1, NL * B * H)]}}.

rnn_layer_shapes(#{cell := Cell, dims := {_, _, I, H, _}}, K) ->
    G = case Cell of gru -> 3; lstm -> 4 end,
    #{w_ih => {G * H, case K of 1 -> I; _ -> H end}, w_hh => {G * H, H}, b_ih => {G * H}, b_hh => {G * H}}.

%% The call's arguments: X, Layers and the options of the inputs given.
rnn_args(P = #{type := Type, state_type := State, dims := {B, L, I, H, NL}, values := Vs, given := Given}) ->
    Layers = [maps:map(fun(K, V) -> t(Type, maps:get(K, rnn_layer_shapes(P, N)), V) end, Lv)
              || {N, Lv} <- lists:zip(lists:seq(1, NL), maps:get(layers, Vs))],
    {t(Type, {B, L, I}, maps:get(x, Vs)), Layers,
     maps:from_list([{K, t(State, {NL, B, H}, maps:get(K, Vs))} || K <- Given])}.

%% Y, Hn and Cn as value lists (Cn [] for the GRU).
rnn_run(#{cell := Cell}, X, Layers, Opts) ->
    case Cell of
        gru -> {Y, Hn} = fusex:gru(X, Layers, Opts#{return_state => true}), {vals(Y), vals(Hn), []};
        lstm -> {Y, {Hn, Cn}} = fusex:lstm(X, Layers, Opts#{return_state => true}), {vals(Y), vals(Hn), vals(Cn)}
    end.

rnn_want(P = #{cell := Cell, dims := Dims, values := Vs, given := Given}) ->
    {Y, Hn, Cn} = fusex_test_util:rnn_reference(Cell, Dims, maps:merge(Vs, maps:with(Given, Vs)), Given),
    {rounded(maps:get(type, P), Y), Hn, case Cell of gru -> []; lstm -> Cn end}.

rnn_forward() ->
    P = rnn_problem(pick(floats())),
    #{type := Type} = P,
    Run = fun() -> poison_heap([4096]), {X, Layers, Opts} = rnn_args(P), rnn_run(P, X, Layers, Opts) end,
    {WantY, WantH, WantC} = rnn_want(P),
    %% 16-bit inputs: the states are f32 over rounded gates' inputs
    Tol = case Type of {f, 64} -> 1.0e-10; {f, 32} -> 1.0e-5; _ -> 3.0e-2 end,
    Check = fun({Y, Hn, Cn}) -> all_ok([close_l2(Y, WantY, Tol), close_l2(Hn, WantH, Tol),
                                        close_l2(Cn, WantC, Tol)]) end,
    #{kind => rnn_forward, desc => {maps:get(cell, P), Type, maps:get(dims, P), maps:get(given, P)}, run => Run,
      expect => valid, check => Check}.

%% Every gradient against central differences of the f64 forward on the
%% CPU along a random direction: L = <Wy, Y> + <Wh, Hn> (+ <Wc, Cn>).
rnn_backward() ->
    put(fuzz_device, cpu),
    P = rnn_problem({f, 64}),
    #{cell := Cell, dims := {B, L, _, H, NL}, values := Vs, given := Given} = P,
    Dir = maps:map(fun(layers, Ls) -> [maps:map(fun(_, V) -> [rand:normal() || _ <- V] end, Lv) || Lv <- Ls];
                      (_, V) -> [rand:normal() || _ <- V]
                   end, maps:with([x, layers | Given], Vs)),
    Wy = [rand:normal() || _ <- lists:seq(1, B * L * H)],
    Wh = [rand:normal() || _ <- lists:seq(1, NL * B * H)],
    Wc = [rand:normal() || _ <- lists:seq(1, NL * B * H)],
    Loss = fun(Q) ->
                   {X, Layers, Opts} = rnn_args(Q),
                   {Y, Hn, Cn} = rnn_run(Q, X, Layers, Opts),
                   dot(Wy, Y) + dot(Wh, Hn) + case Cell of gru -> 0; lstm -> dot(Wc, Cn) end
           end,
    Along = fun(E) -> P#{values := maps:map(fun(layers, Ls) ->
                                                    [maps:map(fun(K, V) -> axpy(E, maps:get(K, Dl), V) end, Lv)
                                                     || {Lv, Dl} <- lists:zip(Ls, maps:get(layers, Dir))];
                                               (K, V) -> case Dir of #{K := Dv} -> axpy(E, Dv, V); _ -> V end
                                            end, Vs)} end,
    Run = fun() ->
                  {X, Layers, Opts} = rnn_args(P),
                  State = {f, 64},
                  Dy = tr({B, L, H}, Wy),
                  Dh = t(State, {NL, B, H}, Wh),
                  Grads = case Cell of
                              gru -> {_, Ctx} = fusex:gru(X, Layers, Opts#{save_for_backward => true}),
                                     poison_heap([4096]),
                                     fusex:gru_backward(Dy, Ctx, #{dh_n => Dh});
                              lstm -> {_, Ctx} = fusex:lstm(X, Layers, Opts#{save_for_backward => true}),
                                      poison_heap([4096]),
                                      fusex:lstm_backward(Dy, Ctx, #{dh_n => Dh, dc_n => t(State, {NL, B, H}, Wc)})
                          end,
                  An = lists:sum([dot(vals(maps:get(K, Grads)), maps:get(K, Dir)) || K <- [x | Given]]) +
                      lists:sum([dot(vals(maps:get(K, Gl)), maps:get(K, Dl))
                                 || {Gl, Dl} <- lists:zip(maps:get(layers, Grads), maps:get(layers, Dir)),
                                    K <- [w_ih, w_hh, b_ih, b_hh]]),
                  E = 1.0e-6,
                  Fd = (Loss(Along(E)) - Loss(Along(-E))) / (2 * E),
                  {lists:sort(maps:keys(Grads)), An, Fd, Loss(P)}
          end,
    WantKeys = lists:sort([x, layers | Given]),
    Check = fun({Keys, An, Fd, L0}) when Keys =:= WantKeys -> fd_close(An, Fd, L0);
               ({Keys, _, _, _}) -> {fail, {gradient_keys, Keys, expected, WantKeys}}
            end,
    #{kind => rnn_backward, desc => {Cell, maps:get(dims, P), Given}, run => Run, expect => valid, check => Check}.

%% One frame of every layer (states in place) against the reference's
%% first step from h0 (and c0).
rnn_step() ->
    P0 = rnn_problem(pick(floats())),
    #{cell := Cell, type := Type, state_type := State, dims := {B, _, I, H, NL}, values := Vs} = P0,
    P = P0#{dims := {B, 1, I, H, NL}, given := [h0 | [c0 || Cell =:= lstm]],
            values := Vs#{x := rounded(Type, [rand:normal() || _ <- lists:seq(1, B * I)])}},
    Run = fun() ->
                  {_, Layers, _} = rnn_args(P),
                  Xt = t(Type, {B, I}, maps:get(x, maps:get(values, P))),
                  Hs = t(State, {NL, B, H}, maps:get(h0, Vs)),
                  case Cell of
                      gru -> {Yt, Hs} = fusex:gru_step(Hs, Xt, Layers), {vals(Yt), vals(Hs), []};
                      lstm -> Cs = t(State, {NL, B, H}, maps:get(c0, Vs)),
                              {Yt, {Hs, Cs}} = fusex:lstm_step({Hs, Cs}, Xt, Layers), {vals(Yt), vals(Hs), vals(Cs)}
                  end
          end,
    {WantY, WantH, WantC} = rnn_want(P),
    Tol = case Type of {f, 64} -> 1.0e-10; {f, 32} -> 1.0e-5; _ -> 3.0e-2 end,
    Check = fun({Y, Hn, Cn}) -> all_ok([close_l2(Y, WantY, Tol), close_l2(Hn, WantH, Tol),
                                        close_l2(Cn, WantC, Tol)]) end,
    #{kind => rnn_step, desc => {Cell, Type, {B, I, H, NL}}, run => Run, expect => valid, check => Check}.

%% A valid call with one layer's parameter of a wrong shape or type, or h0
%% of a wrong shape: refused, naming it ("layers[1].w_hh", "h0").
rnn_bad_input() ->
    P = rnn_problem({f, 32}),
    #{dims := {B, _, _, H, NL}} = P,
    N = ri(NL),
    Wider = fun(Shape) -> setelement(tuple_size(Shape), Shape, element(tuple_size(Shape), Shape) + 1) end,
    {What, Arg} = case ri(4) of
                      4 -> {h0, <<"h0">>};
                      _ -> Param = pick([w_ih, w_hh, b_ih, b_hh]),
                           {{N, Param}, iolist_to_binary(io_lib:format("layers[~b].~s", [N - 1, Param]))}
                  end,
    Run = fun() ->
                  {X, Layers, Opts} = rnn_args(P),
                  case What of
                      h0 -> rnn_run(P, X, Layers, Opts#{h0 => t({f, 32}, {NL + 1, B, H},
                                                                values({f, 32}, (NL + 1) * B * H))});
                      {N, K} ->
                          Shape = maps:get(K, rnn_layer_shapes(P, N)),
                          %% (w_hh's columns are hidden, which layer 0's fixes: its rows)
                          Changed = case K of w_hh -> setelement(1, Shape, element(1, Shape) + 1);
                                        _ -> Wider(Shape) end,
                          {Type, Shape2} = pick([{{f, 32}, Changed}, {{s, 32}, Shape}]),
                          Bad = t(Type, Shape2, values(Type, numel(Shape2))),
                          rnn_run(P, X, replace(N, Layers, (lists:nth(N, Layers))#{K => Bad}), Opts)
                  end
          end,
    #{kind => rnn_bad_input, desc => {maps:get(cell, P), maps:get(dims, P), What}, run => Run, expect => error,
      arg => Arg}.

%% A valid call with one thing changed (a layer map's value, a layer, the
%% layer list or an option replaced by junk, an unknown key): a clean error
%% or a sane result.
mutated_rnn() ->
    P = rnn_problem(pick([{f, 32}, {f, 64}])),
    #{cell := Cell} = P,
    {X, Layers, Opts} = rnn_args(P),
    N = ri(length(Layers)),
    {Layers2, Opts2} = case ri(5) of
                           1 -> {replace(N, Layers, (lists:nth(N, Layers))#{pick([w_ih, w_hh, b_ih, b_hh]) => junk()}),
                                 Opts};
                           2 -> {replace(N, Layers, junk()), Opts};
                           3 -> {junk(), Opts};
                           4 -> {replace(N, Layers, (lists:nth(N, Layers))#{junk_key() => junk_tensor()}), Opts};
                           5 -> {Layers, Opts#{pick([h0, c0, return_state, save_for_backward, junk_key()]) => junk()}}
                       end,
    Run = fun() -> fusex:Cell(X, Layers2, Opts2) end,
    #{kind => mutated_rnn, desc => {Cell, [summary(L) || L <- [Layers2]], summary(Opts2)}, run => Run,
      expect => any}.

%% Args and Opts with input K replaced.
put_input(Op, K, T, Args, Opts) ->
    Positional = case Op of layer_norm -> [x, weight, bias]; rms_norm -> [x, weight]; _ -> [x, w] end,
    case string:str(Positional, [K]) of
        0 -> {Args, Opts#{K => T}};
        I -> {replace(I, Args, T), Opts}
    end.

%% A valid layer call with one thing changed (an argument or an option's
%% value replaced by junk, an unknown option, junk in an optional input):
%% a clean error or a sane result; junk that is no tensor in an argument's
%% place is refused naming that argument.
mutated_layer() ->
    P = layer_problem(pick([{f, 32}, {f, 64}])),
    #{op := Op} = P,
    {Args, Opts} = layer_args(P, fun t/3),
    Positional = case Op of layer_norm -> [x, weight, bias]; rms_norm -> [x, weight]; _ -> [x, w] end,
    Mutation = pick([arg, arg, opt_value, opt_key, opt_tensor]),
    {Args2, Opts2, Arg} =
        case Mutation of
            arg ->
                I = ri(length(Args)), J = junk(),
                {replace(I, Args, J), Opts, [atom_to_binary(lists:nth(I, Positional)) || not is_reference(J)]};
            opt_value when map_size(Opts) > 0 -> K = pick(maps:keys(Opts)), {Args, Opts#{K := junk()}, []};
            opt_key -> {Args, Opts#{junk_key() => junk()}, []};
            _ -> {Args, Opts#{pick([bias, initial_state, residual, gate, activation]) => junk_tensor()}, []}
        end,
    Case = #{kind => mutated_layer, desc => {Op, Mutation, [summary(A) || A <- Args2], summary(Opts2)},
             run => fun() -> apply(fusex, Op, Args2 ++ [Opts2]) end, expect => any},
    case Arg of [Name] -> Case#{expect => error, arg => Name}; [] -> Case end.

%% -- freed tensors, huge empty ones, mutated calls, junk --

%% A valid scan call with one input freed first: refused, naming it.
freed_input() ->
    case chance(0.5) of
        true ->
            P = linrec_problem({f, 32}),
            #{op := Op} = P,
            Run = fun() ->
                          {Args, Opts} = linrec_args(P, fun t/3),
                          ok = fusex:free(lists:nth(ri(length(Args)), Args)),
                          apply(fusex, Op, Args ++ [Opts])
                  end,
            #{kind => freed_input, desc => {Op, freed}, run => Run, expect => error};
        false ->
            In = ssm_problem({f, 32}),
            K = pick([x, dt, a, b, c]),
            Run = fun() ->
                          {Args, O} = ssm_args(In, #{}),
                          Pos = #{x => 1, dt => 2, a => 3, b => 4, c => 5},
                          ok = fusex:free(lists:nth(maps:get(K, Pos), Args)),
                          apply(fusex, selective_scan, Args ++ [O])
                  end,
            #{kind => freed_input, desc => {selective_scan, freed, K}, run => Run, expect => error,
              arg => atom_to_binary(K)}
    end.

%% Zero-element tensors whose other dimensions are huge: the ops return at
%% once, with empty outputs and zero gradients.
huge_empty() ->
    Big = fun() -> 1 bsl (10 + ri(28)) end,
    case pick([ssm, linrec, step, layer]) of
        ssm ->
            {B, L, D} = pick([{Big(), 0, ri(8)}, {0, Big(), ri(8)}, {ri(3), ri(3), 0}, {Big(), 0, 0}]),
            N = ri(4), G = case D of 0 -> ri(3); _ -> 1 end,
            Run = fun() ->
                          Z = fun(S) -> fusex:zeros({f, 32}, S, #{device => dev()}) end,
                          X = Z({B, L, D}), Bc = Z({B, L, G, N}),
                          {Y, C} = fusex:selective_scan(X, X, Z({D, N}), Bc, Bc, #{save_for_backward => true}),
                          poison_heap([D * N * 4, B * L * G * N * 4]),
                          Gr = fusex:selective_scan_backward(Y, C),
                          {fusex:shape(Y), [vals(T) || {K, T} <- maps:to_list(Gr), lists:member(K, [a, b, c])]}
                  end,
            #{kind => huge_empty, desc => {selective_scan, {B, L, D, N, G}}, run => Run, expect => valid,
              check => fun({{B1, L1, D1}, Vs}) when {B1, L1, D1} =:= {B, L, D} -> all_zero(Vs);
                          (Got) -> {fail, {got, Got}} end};
        linrec ->
            Op = pick(?LINREC),
            {B, L, H} = pick([{Big(), 0, ri(8)}, {0, Big(), ri(8)}, {ri(3), ri(3), 0}]),
            Run = fun() ->
                          Z = fun(S) -> fusex:zeros({f, 32}, S, #{device => dev()}) end,
                          Seq = [Z({B, L, H}) || _ <- seq_names(Op)],
                          Params = case Op of liquid -> [Z({H}), Z({H})]; _ -> [] end,
                          Opts = case Op of liquid -> #{dt => Z({B, L, 1}), save_for_backward => true};
                                     _ -> #{save_for_backward => true} end,
                          {Hs, C} = apply(fusex, Op, Seq ++ Params ++ [Opts]),
                          poison_heap([B * L * 4, H * 4]),
                          Back = list_to_atom(atom_to_list(Op) ++ "_backward"),
                          Gr = fusex:Back(Z({B, L, H}), C),
                          {fusex:shape(Hs), [vals(T) || {K, T} <- maps:to_list(Gr), lists:member(K, [tau, a, dt]),
                                                         numel(fusex:shape(T)) < 1 bsl 16]}
                  end,
            #{kind => huge_empty, desc => {Op, {B, L, H}}, run => Run, expect => valid,
              check => fun({S, Vs}) when S =:= {B, L, H} -> all_zero(Vs); (Got) -> {fail, {got, Got}} end};
        step ->
            {B, D} = pick([{0, ri(8)}, {ri(3), 0}]),
            Run = fun() ->
                          Z = fun(S) -> fusex:zeros({f, 32}, S, #{device => dev()}) end,
                          fusex:shape(fusex:selective_scan_step(Z({B, D, 4}), Z({B, D}), Z({B, D}), Z({D, 4}),
                                                                Z({B, 4}), Z({B, 4}), #{}))
                  end,
            #{kind => huge_empty, desc => {selective_scan_step, {B, D}}, run => Run, expect => valid,
              check => fun(S) when S =:= {B, D} -> ok; (S) -> {fail, {got, S}} end};
        layer -> % no rows: y empty, the parameters' gradients zero
            Op = pick(?LAYERS), N = Big(),
            Run = fun() ->
                          Z = fun(S) -> fusex:zeros({f, 32}, S, #{device => dev()}) end,
                          X = Z({N, 0, 3}), P = Z({3}), Opts = #{save_for_backward => true},
                          {Y, C} = case Op of
                                       causal_conv1d -> fusex:causal_conv1d(X, Z({3, 4}), Opts#{bias => P});
                                       linear -> fusex:linear(X, Z({3, 3}), Opts#{bias => P, activation => gelu});
                                       rms_norm -> fusex:rms_norm(X, P, Opts#{bias => P});
                                       layer_norm -> fusex:layer_norm(X, P, P, Opts)
                                   end,
                          poison_heap([64]),
                          Back = list_to_atom(atom_to_list(Op) ++ "_backward"),
                          Gr = fusex:Back(Z(fusex:shape(Y)), C),
                          {fusex:shape(Y), [vals(T) || {K, T} <- maps:to_list(Gr), K =/= x]}
                  end,
            #{kind => huge_empty, desc => {Op, {N, 0, 3}}, run => Run, expect => valid,
              check => fun({{N1, 0, 3}, Vs}) when N1 =:= N -> all_zero(Vs); (Got) -> {fail, {got, Got}} end}
    end.

%% NaN and infinities in the inputs of valid scans: they flow through,
%% with no crash, and the outputs have their shapes.
nonfinite_scan() ->
    Spoil = fun(Vs) -> [case chance(0.2) of true -> pick([nan, inf, ninf]); false -> V end || V <- Vs] end,
    case chance(0.5) of
        true ->
            In0 = ssm_problem(pick(floats())),
            In = maps:map(fun(K, V) when K =:= x; K =:= dt; K =:= a; K =:= b; K =:= c; K =:= h0 -> Spoil(V);
                             (_, V) -> V end, In0),
            #{dims := {B, L, D, _, _} = Dims} = In,
            Run = fun() -> {Args, O} = ssm_args(In, #{save_for_backward => true}),
                           {Y, C} = apply(fusex, selective_scan, Args ++ [O]),
                           G = fusex:selective_scan_backward(Y, C),
                           {fusex:shape(Y), maps:keys(G)} end,
            #{kind => nonfinite_scan, desc => {selective_scan, Dims}, run => Run, expect => valid,
              check => fun({S, _}) when S =:= {B, L, D} -> ok; (Got) -> {fail, {got, Got}} end};
        false ->
            P0 = linrec_problem(pick(floats())),
            P = P0#{seq := [Spoil(S) || S <- maps:get(seq, P0)], h0 := Spoil(maps:get(h0, P0)),
                    opts := maps:remove(return_state, maps:get(opts, P0))},
            #{op := Op, dims := Dims} = P,
            Run = fun() -> {Args, Opts} = linrec_args(P, fun t/3),
                           {H, C} = apply(fusex, Op, Args ++ [Opts#{save_for_backward => true}]),
                           Back = list_to_atom(atom_to_list(Op) ++ "_backward"),
                           G = fusex:Back(H, C),
                           {fusex:shape(H), maps:keys(G)} end,
            #{kind => nonfinite_scan, desc => {Op, Dims}, run => Run, expect => valid,
              check => fun({S, _}) when S =:= Dims -> ok; (Got) -> {fail, {got, Got}} end}
    end.

%% A call whose process is killed at a random moment (maybe in the middle
%% of the dirty call): the VM goes on, a small op right after works, and
%% (checked at the end of the run) no memory is left behind.
killed_call() ->
    In = ssm_problem({f, 32}),
    Delay = ri(3) - 1,
    Run = fun() ->
                  {Args, O} = ssm_args(In, #{save_for_backward => true}),
                  {Pid, Ref} = spawn_monitor(fun() ->
                                                     {Y, C} = apply(fusex, selective_scan, Args ++ [O]),
                                                     fusex:selective_scan_backward(Y, C)
                                             end),
                  timer:sleep(Delay),
                  exit(Pid, kill),
                  receive {'DOWN', Ref, process, Pid, _} -> ok end,
                  vals(fusex:add(t({f, 32}, {2}, [1.0, 2.0]), t({f, 32}, {2}, [3.0, 4.0])))
          end,
    #{kind => killed_call, desc => {killed_after_ms, Delay, maps:get(dims, In)}, run => Run, expect => valid,
      check => fun([4.0, 6.0]) -> ok; (Got) -> {fail, {got, Got}} end}.

all_zero(Lists) ->
    case lists:all(fun(V) -> V == 0 end, lists:append(Lists)) of
        true -> ok;
        false -> {fail, {not_zero, [lists:sublist(L, 4) || L <- Lists]}}
    end.

%% A valid scan call with one thing changed: an argument replaced by junk,
%% or by a tensor of another type, shape or rank; an option of the wrong
%% kind; an option that does not exist. A clean error or a sane result.
mutated_scan() ->
    {Name, Args, Opts} =
        case pick([ssm, linrec]) of
            ssm ->
                In = ssm_problem(pick([{f, 32}, {f, 64}])),
                {A, O} = ssm_args(In, maps:from_list([{K, true} || K <- [return_state, save_for_backward], chance(0.3)])),
                {selective_scan, A, O};
            linrec ->
                P = linrec_problem(pick([{f, 32}, {f, 64}])),
                {A, O} = linrec_args(P, fun t/3),
                {maps:get(op, P), A, O}
        end,
    Mutation = pick([arg, arg, opt_value, opt_key, opt_tensor]),
    {Args2, Opts2} =
        case Mutation of
            arg -> I = ri(length(Args)), {replace(I, Args, junk()), Opts};
            opt_value when map_size(Opts) > 0 -> K = pick(maps:keys(Opts)), {Args, Opts#{K := junk()}};
            opt_key -> {Args, Opts#{junk_key() => junk()}};
            _ -> {Args, Opts#{pick([h0, d, z, dt_bias, dt, dstate]) => junk_tensor()}}
        end,
    #{kind => mutated_scan, desc => {Name, Mutation, [summary(Arg) || Arg <- Args2], summary(Opts2)},
      run => fun() -> apply(fusex, Name, Args2 ++ [Opts2]) end, expect => any}.

replace(I, L, V) -> lists:sublist(L, I - 1) ++ [V] ++ lists:nthtail(I, L).

%% Junk of every kind: terms that are not tensors, tensors of random types
%% and shapes (some freed), numbers beyond 64 bits, maps and lists.
junk() ->
    Gen = weighted([{3, fun junk_tensor/0}, {1, fun() -> pick([foo, true, false, nil, cpu, cuda, {cuda, ri(3) - 2}]) end},
              {2, fun() -> pick([0, -1, 1, 2.5, -0.0, 1.0e300, 1 bsl 64, -(1 bsl 70), 1 bsl 48, 1 bsl 63]) end},
              {1, fun() -> pick([<<>>, <<1, 2, 3>>, binary:copy(<<255>>, ri(64)), <<1:3>>]) end},
              {1, fun() -> list_to_tuple([dim() || _ <- lists:seq(1, ri(10) - 1)]) end},
              {1, fun() -> pick([[], [1, 2], [junk_tensor()], [junk_tensor(), foo], "abc"]) end},
              {1, fun() -> pick([#{}, #{foo => 1}, #{device => tpu}, #{h0 => 1}, #{1 => 2}]) end},
              {1, fun() -> pick([{f, 32}, {f, 8}, {s, 16}, {bf, 16}, {f, 64}, {u, 8}, {x, y, z}]) end},
              {1, fun() -> pick([make_ref(), self(), fun() -> ok end, {local, 0}, {ipc, <<0:512>>}]) end}]),
    Gen().

junk_tensor() ->
    Type = pick(?TYPES), Shape = shape(),
    T = t(Type, Shape, values(Type, numel(Shape))),
    case chance(0.15) of true -> fusex:free(T), T; false -> T end.

junk_key() -> pick([foo, device, "h0", 1, {h0}, save_for_backward_]).

%% Junk in every position of an exported function: each argument kept
%% from a plausible call or replaced.
junk_call() ->
    Exports = [{F, A} || {F, A} <- fusex:module_info(exports), F =/= module_info, A > 0],
    {F, Arity} = pick(Exports),
    Args = [case chance(0.7) of true -> junk(); false -> plausible(F, I) end || I <- lists:seq(1, Arity)],
    Run = case F of
              from_pointer -> % a wild address makes a view nobody must read: only its shape
                  fun() -> V = apply(fusex, F, Args), {from_pointer_view, catch fusex:shape(V)} end;
              _ -> fun() -> apply(fusex, F, Args) end
          end,
    #{kind => junk_call, desc => {F, [summary(A) || A <- Args]}, run => Run, expect => any,
      check => fun({from_pointer_view, _}) -> ok; (R) -> sane(R) end}.

%% A value that fits the position, to give the junk around it a chance
%% to be reached.
plausible(F, I) ->
    case {F, I} of
        {_, 1} when F =:= tensor -> binary:copy(<<0>>, 4 * ri(4));
        {tensor, 2} -> {f, 32};
        {tensor, 3} -> {ri(4)};
        {zeros, 1} -> pick(?TYPES);
        {zeros, 2} -> shape();
        {from_pointer, 2} -> {f, 32};
        {from_pointer, 3} -> {ri(4)};
        {_, _} when F =:= copy; F =:= memory; F =:= synchronize -> pick([cpu, dev()]);
        _ -> pick([junk_tensor(), #{}, junk_tensor()])
    end.
