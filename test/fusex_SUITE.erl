%% Common Test: resource lifetime under load (create/free/GC cycles with
%% memory back to baseline), concurrent processes, and errors that must not
%% disturb later calls.
-module(fusex_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([create_free_gc_cycles/1, concurrent_processes/1, free_while_in_use/1,
         device_out_of_memory/1, host_out_of_memory/1]).

all() -> [create_free_gc_cycles, concurrent_processes, free_while_in_use, device_out_of_memory,
          host_out_of_memory].

init_per_suite(Config) ->
    fusex_test_util:seed(),
    [{device, fusex_test_util:device()} | Config].

end_per_suite(_Config) -> ok.

baseline(Device) ->
    maps:with([allocated, live_tensors], fusex_test_util:settled_memory(Device)).

%% 1e5 tensors: a third freed explicitly, a third dropped for the garbage
%% collector, a third freed and then collected. Memory and the live count
%% must come back to where they started.
create_free_gc_cycles(Config) ->
    Device = ?config(device, Config),
    Before = baseline(Device),
    Data = fusex_test_util:encode({f, 32}, lists:seq(1, 64)),
    lists:foreach(
      fun(I) ->
              T = fusex:tensor(Data, {f, 32}, {8, 8}, #{device => Device}),
              case I rem 3 of
                  0 -> ok = fusex:free(T);
                  1 -> ok;
                  2 -> ok = fusex:free(T), ok = fusex:free(T)
              end,
              I rem 10000 =:= 0 andalso erlang:garbage_collect()
      end, lists:seq(1, 100000)),
    ?assertEqual(Before, baseline(Device)).

%% 16 processes each build, combine and read back their own tensors; every
%% result must be exactly right.
concurrent_processes(Config) ->
    Device = ?config(device, Config),
    Before = baseline(Device),
    Parent = self(),
    Pids = [spawn_link(fun() -> Parent ! {self(), worker(Device, K)} end) || K <- lists:seq(1, 16)],
    Results = [receive {Pid, R} -> R after 120000 -> timeout end || Pid <- Pids],
    ?assertEqual(lists:duplicate(16, ok), Results),
    wait_exited(Pids), % their heaps (and the tensors on them) go when they exit
    ?assertEqual(Before, baseline(Device)).

wait_exited(Pids) ->
    [begin
         Ref = monitor(process, Pid),
         receive {'DOWN', Ref, process, Pid, _} -> ok after 60000 -> error({still_alive, Pid}) end
     end || Pid <- Pids],
    ok.

worker(Device, K) ->
    rand:seed(exsss, K),
    lists:foreach(
      fun(Round) ->
              N = 1 + rand:uniform(5000),
              Xs = [float(rand:uniform(1000)) || _ <- lists:seq(1, N)],
              Ys = [float(Round + K) || _ <- Xs],
              X = fusex_test_util:tensor({f, 32}, {N}, Xs, Device),
              Y = fusex_test_util:tensor({f, 32}, {N}, Ys, Device),
              Z = fusex:multiply(fusex:add(X, Y), fusex:scale(Y, 0.5)),
              Want = [(A + B) * (B * 0.5) || {A, B} <- lists:zip(Xs, Ys)],
              ?assertEqual(Want, fusex_test_util:values(Z)),
              [ok = fusex:free(T) || T <- [X, Y, Z]]
      end, lists:seq(1, 50)),
    ok.

%% One process frees tensors that others are using: every op either
%% succeeds with the right answer or raises the freed-tensor badarg.
free_while_in_use(Config) ->
    Device = ?config(device, Config),
    Before = baseline(Device),
    Xs = [float(I) || I <- lists:seq(1, 100000)],
    Shared = [fusex_test_util:tensor({f, 32}, {100000}, Xs, Device) || _ <- lists:seq(1, 40)],
    Parent = self(),
    Users = [spawn_link(fun() -> Parent ! {self(), use_all(Shared, Xs)} end)
             || _ <- lists:seq(1, 8)],
    timer:sleep(5),
    [ok = fusex:free(T) || T <- Shared],
    Outcomes = lists:append([receive {Pid, O} -> O after 120000 -> [timeout] end || Pid <- Users]),
    ?assertEqual([], [O || O <- Outcomes, O =/= ok, O =/= freed]),
    wait_exited(Users),
    ?assertEqual(Before, baseline(Device)).

use_all(Tensors, Xs) ->
    Want = [X + X || X <- Xs],
    [try fusex_test_util:values(fusex:add(T, T)) of
         Want -> ok;
         Other -> {wrong, lists:sublist(Other, 3)}
     catch
         error:{badarg, <<"a: expected a live tensor", _/binary>>} -> freed
     end || T <- Tensors].

%% Asking a GPU for more memory than it has raises {cuda_error, 2, Msg}
%% and leaves it working. (The CPU case is not tested: with overcommit the
%% allocation can succeed and the zero fill then exhausts the host.)
device_out_of_memory(Config) ->
    case ?config(device, Config) of
        cpu -> {skip, "device OOM is tested on CUDA only"};
        Device ->
            ?assertError({cuda_error, 2, <<"cudaMallocAsync failed: out of memory", _/binary>>},
                         fusex:zeros({f, 32}, {1 bsl 45}, #{device => Device})),
            T = fusex_test_util:tensor({f, 32}, {2}, [1.0, 2.0], Device),
            ?assertEqual([2.0, 4.0], fusex_test_util:values(fusex:add(T, T)))
    end.

%% A host allocation that fails raises {out_of_memory, Msg} and leaves the
%% VM working, for the selective scan's scratch as for fusex:zeros/2 (it
%% used to dereference the NULL). Run in a VM of its own whose address
%% space is limited (ulimit -v), or, under AddressSanitizer (whose shadow
%% memory needs a large address space), whose allocator returns NULL past
%% 1 GiB. The limit is the peak address space of the same VM after a small
%% scan (what the VM and fusex map: 2.1 GB on 2 cores, 4.1 GB on 16) plus
%% 1.5 GiB. The CPU backend's scratch grows with its thread count, so the
%% VMs run two OpenMP threads, as on the CI machine: the forward of dstate
%% 2^23 then needs ~0.7 GB of scratch, its backward 9.8 GB, the forward of
%% 2^25 2.7 GB. They load no CUDA backend, whose driver reserves far more
%% address space. They are this VM's Erlang (its root's bin/erl), not
%% whichever erl comes first on PATH, whose limit and beams could differ.
host_out_of_memory(_Config) ->
    Ebin = filename:dirname(code:which(fusex)),
    ErlBin = filename:join([code:root_dir(), "bin", "erl"]),
    Erl = "FUSEX_DISABLE_CUDA=1 OMP_NUM_THREADS=2 " ++ sh_quote(ErlBin) ++ " -noshell -pa " ++ sh_quote(Ebin)
          ++ " -eval ",
    Expr = "Z = fun(S) -> fusex:zeros({bf,16}, S, #{device => cpu}) end, "
           "Try = fun(F) -> try F() of _ -> returned catch error:{E, M} -> {E, M} end end, "
           "Fwd = fun(N) -> fusex:selective_scan(Z({1,1,1}), Z({1,1,1}), Z({1,N}), Z({1,1,N}), Z({1,1,N}), "
           "              #{save_for_backward => true}) end, "
           "{Y, C} = Fwd(1 bsl 23), "
           "R = [Try(fun() -> Fwd(1 bsl 26) end), Try(fun() -> fusex:selective_scan_backward(Y, C) end), "
           "     fusex:to_binary(fusex:add(Z({2}), Z({2})))], "
           "io:format(\"~n~w.~n\", [R]), halt().",
    Limit = case os:getenv("FUSEX_ASAN") of
                false -> "ulimit -v " ++ integer_to_list(vm_peak_kb(Erl) + 1536 * 1024) ++ "; ";
                _ -> "ASAN_OPTIONS=\"$ASAN_OPTIONS:allocator_may_return_null=1:max_allocation_size_mb=1024\" "
            end,
    Cmd = Limit ++ Erl ++ "'" ++ Expr ++ "' 2>&1",
    Out = os:cmd(Cmd),
    ct:log("~s~n~s", [Cmd, Out]),
    Result = case erl_scan:string(lists:last(string:split(string:trim(Out), "\n", all))) of
                 {ok, Tokens, _} ->
                     case erl_parse:parse_term(Tokens) of
                         {ok, Term} -> Term;
                         {error, _} -> ct:fail({no_result_line, Out})
                     end;
                 _ -> ct:fail({no_result_line, Out})
             end,
    ?assertMatch([{out_of_memory, <<"out of host memory for ", _/binary>>},
                  {out_of_memory, <<"out of host memory for ", _/binary>>},
                  <<0:32>>], Result).

%% A word for sh: single-quoted, each ' in it closed, escaped and reopened.
sh_quote(Word) ->
    "'" ++ lists:flatten(string:replace(Word, "'", "'\\''", all)) ++ "'".

%% The peak address space, in KiB, of a VM started by Erl after a small CPU
%% scan.
vm_peak_kb(Erl) ->
    Expr = "Z = fun(S) -> fusex:zeros({bf,16}, S, #{device => cpu}) end, "
           "fusex:selective_scan(Z({1,4,64}), Z({1,4,64}), Z({64,16}), Z({1,4,16}), Z({1,4,16}), #{}), "
           "{ok, S} = file:read_file(\"/proc/self/status\"), "
           "[Kb | _] = string:lexemes(hd(tl(string:split(S, <<\"VmPeak:\">>))), \" \\t\"), "
           "io:format(\"~nvm_peak_kb ~s~n\", [Kb]), halt().",
    Out = os:cmd(Erl ++ "'" ++ Expr ++ "' 2>&1"),
    ct:log("the probe VM: ~s", [Out]),
    case re:run(Out, "vm_peak_kb ([0-9]+)", [{capture, all_but_first, list}]) of
        {match, [Kb]} -> list_to_integer(Kb);
        nomatch -> ct:fail({no_vm_peak, Out})
    end.
