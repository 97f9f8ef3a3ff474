%% EUnit: pointer interop on the device under test. Local pointers round
%% trip (export, import, ops on the view, writes through it reach the
%% owner), views keep their owner's memory, a freed owner is refused, and
%% every bad pointer raises a badarg naming what was expected. The
%% cross-process IPC test against PyTorch is test/ipc/ (make test-ipc).
-module(fusex_pointer_tests).

-include_lib("eunit/include/eunit.hrl").

-import(fusex_test_util, [device/0, tensor/3, values/1]).

-define(assertBadarg(Msg, Expr), badarg_is(Msg, fun() -> Expr end)).

%% The expected message is built at run time (it holds addresses), so it
%% cannot be a pattern.
badarg_is(Msg, F) ->
    try F() of
        Result -> error({expected_badarg, Msg, got_result, Result})
    catch
        error:{badarg, Got} -> ?assertEqual(Msg, Got)
    end.

setup_test_() ->
    {setup, fun fusex_test_util:seed/0, fun(_) -> ok end, []}.

opts() -> #{device => device()}.

local_round_trip_test_() ->
    Cases = [{Type, Shape} || Type <- [{f, 32}, {bf, 16}, {f, 16}, {s, 64}, {u, 8}],
                              Shape <- [{1}, {7}, {3, 5}, {2, 3, 37}, {4099}]],
    [{lists:flatten(io_lib:format("~p ~p", [Type, Shape])),
      fun() ->
              N = lists:foldl(fun(D, A) -> D * A end, 1, tuple_to_list(Shape)),
              Bin = rand:bytes(N * element(2, Type) div 8),
              T = fusex:tensor(Bin, Type, Shape, opts()),
              {local, Addr, Size} = fusex:to_pointer(T, local),
              ?assert(Addr > 0),
              ?assertEqual(byte_size(Bin), Size),
              V = fusex:from_pointer({local, Addr, Size}, Type, Shape, opts()),
              ?assertEqual(Shape, fusex:shape(V)),
              ?assertEqual(Type, fusex:type(V)),
              ?assertEqual(device(), fusex:device(V)),
              ?assertEqual(Bin, fusex:to_binary(V)),
              %% the view is the same memory: its pointer is the owner's
              ?assertMatch({local, Addr, Size}, fusex:to_pointer(V, local)),
              %% T is live up to here: were it collected after to_pointer,
              %% its memory would be freed under the view
              true = fusex_nif:is_live(T)
      end} || {Type, Shape} <- Cases].

op_on_view_and_write_through_test() ->
    Xs = fusex_test_util:normal(1000),
    Owner = tensor({f, 32}, {10, 100}, Xs),
    {local, Addr, _} = fusex:to_pointer(Owner, local),
    View = fusex:from_pointer({local, Addr}, {f, 32}, {1000}, opts()),
    %% an op reading the view
    Doubled = fusex:scale(View, 2.0),
    ?assertEqual([2 * X || X <- values(Owner)], values(Doubled)),
    %% an op writing through the view: the owner sees the result
    ok = fusex:copy_into(Doubled, View),
    ?assertEqual(values(Doubled), values(Owner)),
    ok = fusex:copy_into(fusex:reshape(fusex:add(Owner, Owner), {1000}), View),
    ?assertEqual([4 * X || X <- values(fusex:convert(tensor({f, 32}, {1000}, Xs), {f, 32}))],
                 values(Owner)).

interior_pointer_test() ->
    Owner = tensor({f, 32}, {10}, [float(I) || I <- lists:seq(0, 9)]),
    {local, Addr, _} = fusex:to_pointer(Owner, local),
    Middle = fusex:from_pointer({local, Addr + 3 * 4}, {f, 32}, {4}, opts()),
    ?assertEqual([3.0, 4.0, 5.0, 6.0], values(Middle)),
    ok = fusex:copy_into(tensor({f, 32}, {4}, [-1.0, -2.0, -3.0, -4.0]), Middle),
    ?assertEqual([0.0, 1.0, 2.0, -1.0, -2.0, -3.0, -4.0, 7.0, 8.0, 9.0], values(Owner)),
    Last = fusex:from_pointer({local, Addr + 9 * 4}, {f, 32}, {1}, opts()),
    ?assertEqual([9.0], values(Last)),
    ?assertBadarg(<<"pointer: expected 8 bytes inside the fusex allocation of 40 bytes at ",
                    (hex(Addr))/binary, ", got an address 36 bytes into it">>,
                  fusex:from_pointer({local, Addr + 9 * 4}, {f, 32}, {2}, opts())),
    ?assertBadarg(<<"pointer: expected 44 bytes inside the fusex allocation of 40 bytes at ",
                    (hex(Addr))/binary, ", got an address 0 bytes into it">>,
                  fusex:from_pointer({local, Addr}, {f, 32}, {11}, opts())).

hex(Addr) -> list_to_binary("0x" ++ string:lowercase(integer_to_list(Addr, 16))).

view_keeps_owner_memory_test() ->
    Device = device(),
    %% the earlier tests' tensors, garbage in this process, go now rather
    %% than between the two readings of the device's memory
    erlang:garbage_collect(),
    Owner = tensor({f, 64}, {500}, lists:duplicate(500, 1.5)),
    #{allocated := A0} = fusex:memory(Device),
    {local, Addr, Size} = fusex:to_pointer(Owner, local),
    View = fusex:from_pointer({local, Addr, Size}, {f, 64}, {500}, opts()),
    ok = fusex:free(Owner),
    %% the view holds the owner's buffer: nothing was returned yet
    ?assertEqual(A0, maps:get(allocated, fusex:memory(Device))),
    ?assertEqual(lists:duplicate(500, 1.5), values(View)),
    ok = fusex:free(View),
    ?assertEqual(A0 - 4000, maps:get(allocated, fusex:memory(Device))),
    %% and now the address is memory fusex freed
    ?assertBadarg(<<"pointer: expected live memory, got ", (hex(Addr))/binary,
                    " inside a fusex allocation of 4000 bytes at ", (hex(Addr))/binary,
                    " that was freed (use-after-free of its owner)">>,
                  fusex:from_pointer({local, Addr, Size}, {f, 64}, {500}, opts())).

use_after_free_of_owner_test() ->
    T = tensor({f, 32}, {64}, fusex_test_util:normal(64)),
    {local, Addr, Size} = fusex:to_pointer(T, local),
    ok = fusex:free(T),
    Msg = <<"pointer: expected live memory, got ", (hex(Addr + 16))/binary,
            " inside a fusex allocation of 256 bytes at ", (hex(Addr))/binary,
            " that was freed (use-after-free of its owner)">>,
    %% refused inside the freed range and at its start
    ?assertBadarg(Msg, fusex:from_pointer({local, Addr + 16}, {f, 32}, {4}, opts())),
    ?assertError({badarg, <<"pointer: expected live memory", _/binary>>},
                 fusex:from_pointer({local, Addr, Size}, {f, 32}, {64}, opts())).

%% A tensor freed by the garbage collector is refused the same way.
use_after_collect_test() ->
    Self = self(),
    Pid = spawn(fun() ->
                        T = tensor({f, 32}, {32}, fusex_test_util:normal(32)),
                        Self ! {self(), fusex:to_pointer(T, local)}
                end),
    {local, Addr, _} = receive {Pid, P} -> P after 5000 -> error(timeout) end,
    wait_dead(Pid),
    ?assertEqual(refused, refused_within(Addr, 100)).

%% A dead process's heap (and the tensor resources on it) may be released
%% a little after its 'DOWN' message: retry for up to a second.
refused_within(_, 0) -> still_accepted;
refused_within(Addr, Tries) ->
    try fusex:from_pointer({local, Addr}, {f, 32}, {32}, opts()) of
        View ->
            fusex:free(View),
            timer:sleep(10),
            refused_within(Addr, Tries - 1)
    catch
        error:{badarg, <<"pointer: expected live memory", _/binary>>} -> refused
    end.

wait_dead(Pid) ->
    Ref = monitor(process, Pid),
    receive {'DOWN', Ref, _, _, _} -> ok after 5000 -> error(timeout) end.

bad_pointers_test_() ->
    T = tensor({f, 32}, {4}, [1.0, 2.0, 3.0, 4.0]),
    {local, Addr, _} = fusex:to_pointer(T, local),
    O = opts(),
    Cases =
        [{<<"pointer: expected a non-null address, got 0">>,
          fun() -> fusex:from_pointer({local, 0}, {f, 32}, {4}, O) end},
         {<<"pointer: expected an address aligned to 4 bytes (the size of {f,32}), got ",
            (hex(Addr + 2))/binary>>,
          fun() -> fusex:from_pointer({local, Addr + 2}, {f, 32}, {1}, O) end},
         {<<"pointer: expected an address aligned to 8 bytes (the size of {f,64}), got ",
            (hex(Addr + 4))/binary>>,
          fun() -> fusex:from_pointer({local, Addr + 4}, {f, 64}, {1}, O) end},
         {<<"pointer: expected a region of at least 16 bytes (shape {4} of {f,32}), got 12 bytes">>,
          fun() -> fusex:from_pointer({local, Addr, 12}, {f, 32}, {4}, O) end},
         {<<"pointer: expected an address from 0 to 2^64-1, got -1">>,
          fun() -> fusex:from_pointer({local, -1}, {f, 32}, {4}, O) end},
         {<<"pointer: expected an address from 0 to 2^64-1, got 18446744073709551616">>,
          fun() -> fusex:from_pointer({local, 1 bsl 64}, {f, 32}, {4}, O) end},
         {<<"pointer: expected a byte size from 0 to 2^64-1, got 1180591620717411303424">>,
          fun() -> fusex:from_pointer({local, Addr, 1 bsl 70}, {f, 32}, {4}, O) end},
         {<<"offset: expected an integer from -2^63 to 2^63-1, got 1180591620717411303424">>,
          fun() -> fusex:from_pointer({local, Addr}, {f, 32}, {4}, O#{offset => 1 bsl 70}) end},
         {<<"pointer: expected {local, Address}, {ipc, Handle} or either with a byte size as a third element, got {remote,1}">>,
          fun() -> fusex:from_pointer({remote, 1}, {f, 32}, {4}, O) end},
         {<<"pointer: expected {local, Address}, {ipc, Handle} or either with a byte size as a third element, got 12345">>,
          fun() -> fusex:from_pointer(12345, {f, 32}, {4}, O) end},
         {<<"pointer: expected a 64-byte CUDA IPC handle (cudaIpcMemHandle_t), got 3 bytes">>,
          fun() -> fusex:from_pointer({ipc, <<1, 2, 3>>}, {f, 32}, {4}, O) end},
         {<<"offset: expected no offset for a local pointer (add it to the address), got 8">>,
          fun() -> fusex:from_pointer({local, Addr}, {f, 32}, {2}, O#{offset => 8}) end},
         {<<"type: expected one of {f,32}, {f,64}, {bf,16}, {f,16}, {s,32}, {s,64}, {u,8}, got {f,8}">>,
          fun() -> fusex:from_pointer({local, Addr}, {f, 8}, {4}, O) end},
         {<<"shape: expected a tuple of non-negative integers, got [4]">>,
          fun() -> fusex:from_pointer({local, Addr}, {f, 32}, [4], O) end},
         {<<"sync: expected true or false, got yes">>,
          fun() -> fusex:from_pointer({local, Addr}, {f, 32}, {4}, O#{sync => yes}) end},
         {<<"opts: expected only the options [device,sync,offset], got [size]">>,
          fun() -> fusex:from_pointer({local, Addr}, {f, 32}, {4}, O#{size => 1}) end},
         {<<"kind: expected local or ipc, got remote">>, fun() -> fusex:to_pointer(T, remote) end},
         {<<"opts: expected only the options [sync], got [kind]">>,
          fun() -> fusex:to_pointer(T, local, #{kind => ipc}) end},
         {<<"tensor: expected a fusex tensor, got foo">>, fun() -> fusex:to_pointer(foo, local) end},
         {<<"ipc: expected true or false, got 1">>,
          fun() -> fusex:zeros({f, 32}, {2}, #{device => cpu, ipc => 1}) end},
         {<<"dst: expected shape {4} (the shape of src), got {3}">>,
          fun() -> fusex:copy_into(T, tensor({f, 32}, {3}, [0.0, 0.0, 0.0])) end},
         {<<"dst: expected type {f,32}, got {f,64}">>,
          fun() -> fusex:copy_into(T, fusex:zeros({f, 64}, {4}, O)) end}],
    [{binary_to_list(Msg), fun() -> ?assertBadarg(Msg, F()) end} || {Msg, F} <- Cases].

freed_tensor_to_pointer_test() ->
    T = tensor({f, 32}, {2}, [1.0, 2.0]),
    ok = fusex:free(T),
    ?assertBadarg(<<"tensor: expected a live tensor, got one released by fusex:free/1">>,
                  fusex:to_pointer(T, local)).

%% The CPU keeps host memory: local pointers only.
cpu_has_no_ipc_test() ->
    T = fusex:tensor(<<1.0:32/float-native>>, {f, 32}, {1}, #{device => cpu}),
    ?assertBadarg(<<"kind: expected local for a tensor on cpu (ipc handles are CUDA memory), got ipc">>,
                  fusex:to_pointer(T, ipc)),
    Ipc = <<"ipc: expected a CUDA device (IPC handles are CUDA memory), got cpu; use local pointers on cpu">>,
    ?assertBadarg(Ipc, fusex:zeros({f, 32}, {2}, #{device => cpu, ipc => true})),
    ?assertBadarg(Ipc, fusex:tensor(<<0:32>>, {f, 32}, {1}, #{device => cpu, ipc => true})),
    ?assertBadarg(Ipc, fusex:copy(T, cpu, #{ipc => true})),
    ?assertBadarg(<<"device: expected a CUDA device for an ipc handle, got cpu">>,
                  fusex:from_pointer({ipc, binary:copy(<<0>>, 64)}, {f, 32}, {1},
                                     #{device => cpu})).

%% Zero-element tensors export and import like any other (with a
%% non-null address when the caller has one).
empty_tensor_test() ->
    T = fusex:zeros({f, 32}, {0, 3}, opts()),
    ?assertMatch({local, _, 0}, fusex:to_pointer(T, local)),
    Owner = tensor({f, 32}, {1}, [1.0]),
    {local, Addr, _} = fusex:to_pointer(Owner, local),
    E = fusex:from_pointer({local, Addr}, {f, 32}, {0}, opts()),
    ?assertEqual(<<>>, fusex:to_binary(E)).

%% ---- CUDA only: pool memory has no IPC handle; ipc => true memory does,
%% and the same process cannot open its own handle ----

cuda_ipc_test_() ->
    case device() of
        cpu -> [];
        Gpu -> [fun() -> cuda_ipc(Gpu) end, fun() -> cuda_foreign_host(Gpu) end]
    end.

cuda_ipc(Gpu) ->
    Pool = tensor({f, 32}, {4}, [1.0, 2.0, 3.0, 4.0], Gpu),
    ?assertBadarg(<<"tensor: expected a tensor allocated with ipc => true, got pool memory; use fusex:copy(T, Device, #{ipc => true})">>,
                  fusex:to_pointer(Pool, ipc)),
    Exportable = fusex:copy(Pool, Gpu, #{ipc => true}),
    ?assertEqual(values(Pool), values(Exportable)),
    {ipc, Handle, 16} = fusex:to_pointer(Exportable, ipc),
    ?assertEqual(64, byte_size(Handle)),
    ?assertMatch({ipc, Handle, 16}, fusex:to_pointer(fusex:reshape(Exportable, {2, 2}), ipc)),
    Z = fusex:zeros({bf, 16}, {3}, #{device => Gpu, ipc => true}),
    ?assertMatch({ipc, <<_:64/binary>>, 6}, fusex:to_pointer(Z, ipc)),
    %% a local import of cudaMalloc memory is checked like pool memory
    {local, Addr, _} = fusex:to_pointer(Exportable, local),
    ?assertEqual(values(Pool), values(fusex:from_pointer({local, Addr}, {f, 32}, {4}, #{device => Gpu}))),
    ?assertError({cuda_error, _, <<"cudaIpcOpenMemHandle failed", _/binary>>},
                 fusex:from_pointer({ipc, Handle}, {f, 32}, {4}, #{device => Gpu})),
    View = fusex:from_pointer({local, Addr}, {f, 32}, {4}, #{device => Gpu}),
    ?assertBadarg(<<"tensor: expected a tensor allocated by fusex with ipc => true, got a view of memory fusex does not own (from_pointer); export it where it was allocated">>,
                  fusex:to_pointer(fusex:from_pointer({local, Addr + 4}, {f, 32}, {1}, #{device => Gpu}), ipc)),
    fusex:free(View).

tensor(Type, Shape, Values, Device) -> fusex_test_util:tensor(Type, Shape, Values, Device).

%% A host address handed to a CUDA device is refused by the driver check.
cuda_foreign_host(Gpu) ->
    Host = fusex:tensor(<<0:128>>, {f, 32}, {4}, #{device => cpu}),
    {local, Addr, _} = fusex:to_pointer(Host, local),
    ?assertError({badarg, <<"pointer: expected memory of cuda:", _/binary>>},
                 fusex:from_pointer({local, Addr}, {f, 32}, {4}, #{device => Gpu})).
