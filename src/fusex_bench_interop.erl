%% @private
%% @doc Bench cases for pointer interop: what a zero-copy hand-over costs
%% (export with a stream synchronize, import with a device synchronize),
%% against the copy it replaces.
-module(fusex_bench_interop).

-export([cases/1]).

-define(MIB16, (16 bsl 20)).

cases(Device) ->
    Opts = #{device => Device},
    [#{op => <<"to_pointer local (sync)">>, shape => <<"16 MiB">>, dtype => {u, 8},
       bytes => 0, kernel => false, reps => 200, e2e_target_us => 15,
       setup => fun() -> fusex:zeros({u, 8}, {?MIB16}, Opts) end,
       run => fun(T, _) -> fusex:to_pointer(T, local) end},
     #{op => <<"from_pointer local view (device sync)">>, shape => <<"16 MiB">>, dtype => {u, 8},
       bytes => 0, kernel => false, reps => 200, e2e_target_us => 20,
       setup => fun() ->
                        T = fusex:zeros({u, 8}, {?MIB16}, Opts),
                        {T, fusex:to_pointer(T, local)}
                end,
       run => fun({_, P}, _) -> fusex:from_pointer(P, {u, 8}, {?MIB16}, Opts) end},
     #{op => <<"copy (what a view saves)">>, shape => <<"16 MiB">>, dtype => {u, 8},
       bytes => 2 * ?MIB16, reps => 100,
       setup => fun() -> fusex:zeros({u, 8}, {?MIB16}, Opts) end,
       run => fun(T, _) -> fusex:copy(T, Device) end}].
