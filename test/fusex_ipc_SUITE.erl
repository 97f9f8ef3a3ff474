%% Common Test: CUDA IPC across processes, against PyTorch. A Python
%% process allocates a CUDA tensor and exports its IPC handle (with the
%% tensor's byte offset inside its allocation); this node imports it, runs
%% an op on it, writes the result into a fusex tensor allocated with
%% `ipc => true' and also back through the mapping; a second Python
%% process opens fusex's handle and checks every value, and the first
%% checks what was written into its own tensor.
%%
%% Needs a CUDA device and `python3' with torch; skipped with the reason
%% otherwise (the helper is test/fusex_ipc_SUITE_data/torch_ipc.py).
-module(fusex_ipc_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([torch_f32/1, torch_bf16/1]).

all() -> [torch_f32, torch_bf16].

init_per_suite(Config) ->
    Seed = fusex_test_util:seed(),
    case fusex_test_util:device() of
        cpu ->
            {skip, "CUDA IPC needs a CUDA device; tests run on cpu (FUSEX_DEVICE)"};
        Gpu ->
            Script = filename:join(?config(data_dir, Config), "torch_ipc.py"),
            case probe(Script) of
                ok -> [{device, Gpu}, {script, Script}, {seed, Seed rem 1000000} | Config];
                {skip, Why} -> {skip, Why}
            end
    end.

end_per_suite(_Config) -> ok.

probe(Script) ->
    case os:find_executable("python3") of
        false -> {skip, "no python3 on PATH"};
        Python ->
            case run(Python, [Script, "probe"]) of
                {0, _} -> ok;
                {_, Out} -> {skip, "no PyTorch with CUDA: " ++ string:trim(Out)}
            end
    end.

torch_f32(Config) -> round_trip(Config, "f32", {f, 32}, 100003).

torch_bf16(Config) -> round_trip(Config, "bf16", {bf, 16}, 4099).

round_trip(Config, DtypeName, Type, N) ->
    Gpu = ?config(device, Config),
    Seed = integer_to_list(?config(seed, Config)),
    Python = os:find_executable("python3"),
    Server = open_port({spawn_executable, Python},
                       [{args, [?config(script, Config), "serve", DtypeName,
                                integer_to_list(N), Seed]},
                        {line, 4096}, use_stdio, exit_status, stderr_to_stdout]),
    try
        {Handle, Offset, Size} = parse_export(recv_line(Server)),
        Factor = 2.5,
        %% import the torch tensor (a borrowed view at the offset torch reported)
        X = fusex:from_pointer({ipc, Handle, Size}, Type, {N},
                               #{device => Gpu, offset => Offset}),
        %% an op into a fusex tensor allocated for export
        Out = fusex:zeros(Type, {N}, #{device => Gpu, ipc => true}),
        ok = fusex:copy_into(fusex:scale(X, Factor), Out),
        {ipc, OutHandle, OutSize} = fusex:to_pointer(Out, ipc),
        ?assertEqual(Size, OutSize),
        %% a second process checks every value fusex wrote
        {Status, Check} = run(Python, [?config(script, Config), "check", DtypeName,
                                       integer_to_list(N), Seed, float_to_list(Factor),
                                       hex(OutHandle), "0", integer_to_list(OutSize)]),
        ct:log("check: ~ts", [Check]),
        ?assertEqual({0, "ok"}, {Status, string:trim(Check)}),
        %% and writes through the mapping reach torch's own tensor
        ok = fusex:copy_into(Out, X),
        ok = fusex:synchronize(X),
        port_command(Server, "verify " ++ float_to_list(Factor) ++ "\n"),
        ?assertEqual("ok", recv_line(Server)),
        ok = fusex:free(X), % closes the mapping before the exporter exits
        port_command(Server, "exit\n"),
        ?assertEqual(0, wait_exit(Server))
    after
        catch port_close(Server)
    end.

parse_export("export " ++ Rest) ->
    Fields = maps:from_list([list_to_tuple(string:split(F, "=")) || F <- string:lexemes(Rest, " ")]),
    {binary:decode_hex(list_to_binary(maps:get("handle", Fields))),
     list_to_integer(maps:get("offset", Fields)), list_to_integer(maps:get("size", Fields))};
parse_export(Other) ->
    ct:fail({python_export_failed, Other}).

hex(Bin) -> string:lowercase(binary_to_list(binary:encode_hex(Bin))).

recv_line(Port) ->
    receive
        {Port, {data, {eol, Line}}} -> Line;
        {Port, {exit_status, S}} -> ct:fail({python_exited, S})
    after 120000 -> ct:fail(python_timeout)
    end.

wait_exit(Port) ->
    receive
        {Port, {exit_status, S}} -> S;
        {Port, {data, _}} -> wait_exit(Port)
    after 60000 -> ct:fail(python_did_not_exit)
    end.

%% Runs a command to completion: {ExitStatus, Output}.
run(Exe, Args) ->
    Port = open_port({spawn_executable, Exe},
                     [{args, Args}, exit_status, stderr_to_stdout, binary, use_stdio]),
    collect(Port, []).

collect(Port, Acc) ->
    receive
        {Port, {data, D}} -> collect(Port, [D | Acc]);
        {Port, {exit_status, S}} -> {S, binary_to_list(iolist_to_binary(lists:reverse(Acc)))}
    after 180000 -> {timeout, binary_to_list(iolist_to_binary(lists:reverse(Acc)))}
    end.
