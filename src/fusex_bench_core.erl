%% @private
%% @doc Bench cases for the foundation: NIF call overhead, launch + sync of
%% a trivial op on resident tensors, host transfers, and a memory-bound
%% elementwise op.
-module(fusex_bench_core).

-export([cases/1, demo/1]).

-define(MIB16, (16 bsl 20)).

cases(Device) ->
    [#{op => <<"nif call, no-op (normal scheduler)">>, shape => <<"-">>, dtype => <<"-">>,
       bytes => 0, kernel => false, sync => false, batch => 1000, reps => 200,
       setup => fun() -> ok end, run => fun(_, _) -> fusex_nif:nop() end},
     #{op => <<"nif call, no-op (dirty IO scheduler)">>, shape => <<"-">>, dtype => <<"-">>,
       bytes => 0, kernel => false, sync => false, batch => 1000, reps => 200,
       e2e_target_us => 5,
       setup => fun() -> ok end, run => fun(_, _) -> fusex_nif:dirty_nop() end},
     #{op => <<"launch+sync, scale 1 element">>, shape => <<"{1}">>, dtype => {f, 32},
       bytes => 8, reps => 500, e2e_target_us => 12,
       setup => fun() -> fusex:tensor(<<1.0:32/float-native>>, {f, 32}, {1}, #{device => Device}) end,
       run => fun(T, _) -> fusex:scale(T, 2.0) end},
     #{op => <<"  of which: scale call alone (enqueue)">>, shape => <<"{1}">>, dtype => {f, 32},
       bytes => 0, kernel => false, sync => false, reps => 500,
       setup => fun() -> fusex:tensor(<<1.0:32/float-native>>, {f, 32}, {1}, #{device => Device}) end,
       run => fun(T, _) -> fusex:scale(T, 2.0) end},
     #{op => <<"  of which: synchronize, idle device">>, shape => <<"-">>, dtype => <<"-">>,
       bytes => 0, kernel => false, sync => false, reps => 500,
       setup => fun() -> ok end, run => fun(_, _) -> fusex:synchronize(Device) end},
     #{op => <<"upload (tensor/4)">>, shape => <<"16 MiB">>, dtype => {u, 8},
       bytes => ?MIB16, kernel => false, reps => 50,
       setup => fun() -> rand:bytes(?MIB16) end,
       run => fun(Bin, _) -> fusex:tensor(Bin, {u, 8}, {?MIB16}, #{device => Device}) end},
     #{op => <<"download (to_binary/1)">>, shape => <<"16 MiB">>, dtype => {u, 8},
       bytes => ?MIB16, kernel => false, sync => false, reps => 50,
       setup => fun() -> fusex:tensor(rand:bytes(?MIB16), {u, 8}, {?MIB16}, #{device => Device}) end,
       run => fun(T, _) -> fusex:to_binary(T) end},
     #{op => <<"add">>, shape => <<"{16777216}">>, dtype => {f, 32},
       bytes => 3 * 4 * ?MIB16, reps => 50,
       setup => fun() ->
                        {fusex_bench:uniform({f, 32}, {?MIB16}, -1, 1, Device),
                         fusex_bench:uniform({f, 32}, {?MIB16}, -1, 1, Device)}
                end,
       run => fun({A, B}, _) -> fusex:add(A, B) end}].

%% make demo rows: elementwise ops on Device against the same ops on cpu in f64.
demo(Device) ->
    Shape = {1000, 37},
    A = fusex_bench:uniform({f, 32}, Shape, -2, 2, Device),
    B = fusex_bench:uniform({f, 32}, Shape, -2, 2, Device),
    Ref = fun(F) -> F(fusex:convert(fusex:copy(A, cpu), {f, 64}),
                      fusex:convert(fusex:copy(B, cpu), {f, 64})) end,
    Ops = [{<<"add">>, fun fusex:add/2}, {<<"multiply">>, fun fusex:multiply/2},
           {<<"scale">>, fun(X, _) -> fusex:scale(X, 0.37) end}],
    [#{op => Name, shape => <<"{1000,37}">>, dtype => {f, 32},
       rel_l2 => fusex_demo:compare(F(A, B), Ref(F), {f, 32}), tolerance => 1.0e-6,
       us => fusex_demo:time_us(fun() -> F(A, B) end, 50)} || {Name, F} <- Ops] ++
    [#{op => <<"convert to bf16">>, shape => <<"{1000,37}">>, dtype => {bf, 16},
       rel_l2 => fusex_demo:compare(fusex:convert(A, {bf, 16}), fusex:convert(fusex:copy(A, cpu), {f, 64}), {bf, 16}),
       tolerance => 1.0e-2, us => fusex_demo:time_us(fun() -> fusex:convert(A, {bf, 16}) end, 50)}].
