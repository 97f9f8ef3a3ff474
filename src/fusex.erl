%% @doc fusex: fused kernels for recurrent and state-space models, on tensors
%% that stay resident on their device between calls.
%%
%% A tensor is a handle to memory on a device (`cpu' or a CUDA GPU). Ops take
%% and return handles; data crosses to the host only through
%% {@link to_binary/1}. Device memory is released by {@link free/1} or when
%% the handle is garbage-collected.
%%
%% GPU work is asynchronous: an op enqueues its kernels on the device's
%% stream and returns; reading a result ({@link to_binary/1},
%% {@link synchronize/1}) waits for it.
%%
%% Errors: bad input raises `error({badarg, Message})' where the message names
%% the argument, what was expected and what came, e.g.
%% `<<"x: expected type {f,32}, got {s,32}">>'. CUDA failures raise
%% `error({cuda_error, Code, Message})'; host allocation failures
%% `error({out_of_memory, Message})'.
-module(fusex).

-export([devices/0, default_device/0, tensor/3, tensor/4, zeros/2, zeros/3, to_binary/1,
         shape/1, type/1, device/1, copy/2, free/1, synchronize/1, memory/0, memory/1,
         convert/2, add/2, subtract/2, multiply/2, scale/2, reshape/2, size/1,
         byte_size/1]).

-export([selective_scan/6, selective_scan_backward/2, selective_scan_backward/3,
         selective_scan_step/7]).

-export_type([tensor/0, type/0, shape/0, device/0, device_info/0]).
-export_type([scan_opts/0, scan_step_opts/0, scan_ctx/0, scan_grads/0]).

-type tensor() :: reference().
%% A handle to a tensor resident on a device.
-type type() :: {f, 32} | {f, 64} | {bf, 16} | {f, 16} | {s, 32} | {s, 64} | {u, 8}.
%% Element types, spelled as Nx spells them.
-type shape() :: tuple().
%% A tuple of non-negative integers, row-major (as in Nx): `{Batch, SeqLen, Dim}'.
-type device() :: cpu | cuda | {cuda, non_neg_integer()}.
%% `cuda' means `{cuda, 0}'.
-type device_info() :: #{id := device(), kind := cpu | cuda, name := binary(),
                         memory_total := non_neg_integer(),
                         memory_free := non_neg_integer(), atom() => term()}.

-define(NIF, fusex_nif).

%% @doc The devices this node can use, CPU first. The CPU entry carries
%% `cuda_unavailable => Reason' when no CUDA device could be used (no
%% backend built, no driver, no GPU, or `FUSEX_DISABLE_CUDA' set); CUDA
%% entries carry `compute_capability' and `multiprocessors'.
-spec devices() -> [device_info()].
devices() -> ?NIF:devices().

%% @doc The device new tensors go to when no `device' option is given: the
%% application env `{fusex, default_device}' if set, else the `FUSEX_DEVICE'
%% environment variable (`cpu', `cuda', `cuda:N'), else the first CUDA
%% device if there is one, else `cpu'.
-spec default_device() -> device().
default_device() ->
    case application:get_env(fusex, default_device) of
        {ok, Device} -> Device;
        undefined -> env_default_device()
    end.

env_default_device() ->
    case persistent_term:get({?MODULE, default_device}, undefined) of
        undefined ->
            Device = parse_env_device(os:getenv("FUSEX_DEVICE")),
            persistent_term:put({?MODULE, default_device}, Device),
            Device;
        Device ->
            Device
    end.

parse_env_device(false) -> first_device();
parse_env_device("") -> first_device();
parse_env_device("cpu") -> cpu;
parse_env_device("cuda") -> {cuda, 0};
parse_env_device("cuda:" ++ N) ->
    try list_to_integer(N) of
        I when I >= 0 -> {cuda, I};
        _ -> erlang:error({badarg, bad_env_device(N)})
    catch
        error:badarg -> erlang:error({badarg, bad_env_device(N)})
    end;
parse_env_device(Other) -> erlang:error({badarg, bad_env_device(Other)}).

bad_env_device(Value) ->
    iolist_to_binary(["FUSEX_DEVICE: expected cpu, cuda or cuda:N, got ", Value]).

first_device() ->
    case [Id || #{kind := cuda, id := Id} <- devices()] of
        [First | _] -> First;
        [] -> cpu
    end.

%% @equiv tensor(Data, Type, Shape, #{})
-spec tensor(binary(), type(), shape()) -> tensor().
tensor(Data, Type, Shape) -> tensor(Data, Type, Shape, #{}).

%% @doc A tensor holding `Data' (row-major, native-endian, exactly the bytes
%% the shape needs) on `device' (default: {@link default_device/0}). On a
%% GPU the call returns once the bytes are staged; the copy completes in
%% stream order.
-spec tensor(binary(), type(), shape(), #{device => device()}) -> tensor().
tensor(Data, Type, Shape, Opts) ->
    ?NIF:tensor(Data, Type, Shape, opt_device(Opts)).

%% @equiv zeros(Type, Shape, #{})
-spec zeros(type(), shape()) -> tensor().
zeros(Type, Shape) -> zeros(Type, Shape, #{}).

%% @doc A zero-filled tensor on `device' (default: {@link default_device/0}).
-spec zeros(type(), shape(), #{device => device()}) -> tensor().
zeros(Type, Shape, Opts) -> ?NIF:zeros(Type, Shape, opt_device(Opts)).

opt_device(Opts) when is_map(Opts) ->
    case maps:keys(Opts) -- [device] of
        [] -> maps:get(device, Opts, default_device());
        Unknown -> erlang:error({badarg, unknown_opts(Unknown, [device])})
    end;
opt_device(Opts) ->
    erlang:error({badarg, iolist_to_binary(io_lib:format("opts: expected a map, got ~0tP",
                                                         [Opts, 10]))}).

unknown_opts(Unknown, Allowed) ->
    iolist_to_binary(io_lib:format("opts: expected only the options ~0tp, got ~0tP",
                                   [Allowed, Unknown, 10])).

%% @doc The tensor's bytes (row-major, native-endian). Waits for pending
%% work on the tensor's device.
-spec to_binary(tensor()) -> binary().
to_binary(T) -> ?NIF:to_binary(T).

%% @doc The tensor's shape.
-spec shape(tensor()) -> shape().
shape(T) -> ?NIF:shape(T).

%% @doc The tensor's element type.
-spec type(tensor()) -> type().
type(T) -> ?NIF:type(T).

%% @doc The device the tensor lives on.
-spec device(tensor()) -> device().
device(T) -> ?NIF:device(T).

%% @doc The number of elements.
-spec size(tensor()) -> non_neg_integer().
size(T) -> tuple_product(shape(T)).

%% @doc The number of bytes the tensor's data occupies.
-spec byte_size(tensor()) -> non_neg_integer().
byte_size(T) ->
    {_, Bits} = type(T),
    ?MODULE:size(T) * Bits div 8.

tuple_product(Shape) -> lists:foldl(fun(D, Acc) -> D * Acc end, 1, tuple_to_list(Shape)).

%% @doc A copy of the tensor on `Device' (which may be its own device).
-spec copy(tensor(), device()) -> tensor().
copy(T, Device) -> ?NIF:copy(T, Device).

%% @doc Releases the tensor's device memory now instead of at garbage
%% collection. Idempotent; any later use of the handle raises
%% `{badarg, <<"...: expected a live tensor, got one released by fusex:free/1">>}'.
%% Memory still read by queued GPU work is reused only after that work.
%% Views made by {@link reshape/2} keep the memory until they go too.
-spec free(tensor()) -> ok.
free(T) -> ?NIF:free(T).

%% @doc Waits until all work queued on the device (of the tensor, or the
%% device given) has finished.
-spec synchronize(tensor() | device()) -> ok.
synchronize(TensorOrDevice) -> ?NIF:synchronize(TensorOrDevice).

%% @equiv memory(default_device())
-spec memory() -> #{allocated := integer(), peak := integer(), live_tensors := integer()}.
memory() -> memory(default_device()).

%% @doc Device memory held by fusex tensors on `Device': bytes allocated
%% now, the peak since start, and the number of live tensor handles.
-spec memory(device()) -> #{allocated := integer(), peak := integer(),
                            live_tensors := integer()}.
memory(Device) -> ?NIF:memory(Device).

%% @doc The tensor converted to `Type' on the same device. Floats round to
%% nearest even; conversions to integers saturate and map NaN to 0.
-spec convert(tensor(), type()) -> tensor().
convert(T, Type) -> ?NIF:convert(T, Type).

%% @doc Elementwise `A + B' (same shape, type and device).
-spec add(tensor(), tensor()) -> tensor().
add(A, B) -> ?NIF:binary_op(add, A, B).

%% @doc Elementwise `A - B' (same shape, type and device).
-spec subtract(tensor(), tensor()) -> tensor().
subtract(A, B) -> ?NIF:binary_op(subtract, A, B).

%% @doc Elementwise `A * B' (same shape, type and device).
-spec multiply(tensor(), tensor()) -> tensor().
multiply(A, B) -> ?NIF:binary_op(multiply, A, B).

%% @doc `T * Factor' for a float tensor (f32 arithmetic, f64 for f64).
-spec scale(tensor(), number()) -> tensor().
scale(T, Factor) -> ?NIF:scale(T, Factor).

%% @doc A view of `T' with another shape of the same element count. It
%% shares T's memory: writes through one (in-place ops) show in the other.
-spec reshape(tensor(), shape()) -> tensor().
reshape(T, Shape) -> ?NIF:reshape(T, Shape).

%% ---- selective scan (Mamba S6) ----

-type scan_opts() :: #{d => tensor(), z => tensor(), dt_bias => tensor(),
                       dt_softplus => boolean(), h0 => tensor(), return_state => boolean(),
                       save_for_backward => boolean()}.
%% Options of {@link selective_scan/6}; all default to absent / `false'.
-type scan_step_opts() :: #{d => tensor(), z => tensor(), dt_bias => tensor(),
                            dt_softplus => boolean()}.
%% Options of {@link selective_scan_step/7}.
-opaque scan_ctx() :: reference().
%% What a forward with `save_for_backward' keeps for
%% {@link selective_scan_backward/3}.
-type scan_grads() :: #{x := tensor(), dt := tensor(), a := tensor(), b := tensor(),
                        c := tensor(), d => tensor(), z => tensor(), dt_bias => tensor(),
                        h0 => tensor()}.
%% One gradient per input given to the forward, with the input's shape and
%% type.

%% @doc The selective scan of Mamba (S6), fused: the state stays on chip
%% for the whole sequence and never goes to memory.
%%
%% Layout (row-major, as in Nx): `X', `Dt' `[batch, seqlen, dim]'; `A'
%% `[dim, dstate]'; `B', `C' `[batch, seqlen, dstate]', or `[batch, seqlen,
%% groups, dstate]' where channel `d' reads group `d div (dim div groups)'
%% (groups must divide dim). Per batch element, channel `d' and state `n':
%% ```
%% delta_t  = softplus(dt_t + dt_bias)     (bias and softplus only when given / asked)
%% h_t[d,n] = exp(delta_t[d] * a[d,n]) * h_{t-1}[d,n] + delta_t[d] * b_t[n] * x_t[d]
%% y_t[d]   = sum_n c_t[n] * h_t[d,n] + d[d] * x_t[d]
%% y_t[d]  *= silu(z_t[d])                 (when z is given)
%% '''
%% with `h_{-1} = h0' (zeros when not given).
%%
%% Options: `d' `[dim]' (skip), `z' `[batch, seqlen, dim]' (gate),
%% `dt_bias' `[dim]', `dt_softplus' (boolean; softplus uses PyTorch's
%% threshold: the identity above 20), `h0' `[batch, dim, dstate]',
%% `return_state' (also return the final state `[batch, dim, dstate]'),
%% `save_for_backward' (also return a context for
%% {@link selective_scan_backward/3}).
%%
%% Types: `X', `Dt', `B', `C', `z' share one type, `{f,32}', `{bf,16}' or
%% `{f,16}' (also `{f,64}' on `cpu'); `Y' has that type. `A', `d',
%% `dt_bias', `h0' may each be any of those float types. Arithmetic is f32
%% on CUDA (f64 on the CPU, the reference). The final state is `{f,32}'
%% (`{f,64}' for `{f,64}' inputs) whatever the input type: a state carried
%% from call to call should not be rounded to 16 bits at every call.
%%
%% Results: `Y'; `{Y, State}' with `return_state'; `{Y, Ctx}' with
%% `save_for_backward'; `{Y, State, Ctx}' with both.
%%
%% Memory kept for the backward: the context holds references to the input
%% tensors (their memory stays alive while the context does, even after
%% {@link free/1}; do not modify them in place, e.g. with
%% {@link selective_scan_step/7}, before the backward) plus, on CUDA, the
%% f32 state entering every chunk of `K' steps: `batch * (ceil(seqlen / K)
%% - 1) * dim * dstate * 4' bytes, with `K = 32' (`K = 16' when `dstate =<
%% 8', `K = 8' when `dstate =< 4'). For `dstate = 16' that is 2 bytes per
%% element of `x'. The CPU keeps no states: its backward recomputes from
%% `h0'. Nothing of size `[batch, seqlen, dim, dstate]' is ever held.
-spec selective_scan(X :: tensor(), Dt :: tensor(), A :: tensor(), B :: tensor(),
                     C :: tensor(), scan_opts()) ->
          tensor() | {tensor(), tensor()} | {tensor(), scan_ctx()} |
          {tensor(), tensor(), scan_ctx()}.
selective_scan(X, Dt, A, B, C, Opts) -> ?NIF:selective_scan(X, Dt, A, B, C, Opts).

%% @equiv selective_scan_backward(Dy, Ctx, #{})
-spec selective_scan_backward(tensor(), scan_ctx()) -> scan_grads().
selective_scan_backward(Dy, Ctx) -> selective_scan_backward(Dy, Ctx, #{}).

%% @doc The gradients of a {@link selective_scan/6} that ran with
%% `save_for_backward', given `Dy' (the gradient of `Y': its shape and
%% type) and, optionally, `dstate' (the gradient of the final state,
%% `[batch, dim, dstate]', any float type).
%%
%% The map has exactly the keys of the inputs the forward was given: `x',
%% `dt', `a', `b', `c' always, `d', `z', `dt_bias', `h0' when given. Each
%% gradient has its input's shape and type (accumulated in f32 on CUDA, in
%% f64 on the CPU): `a', `d', `dt_bias' are summed over batch and time, `b'
%% and `c' over the channels of their group.
%%
%% The backward recomputes the states inside each saved chunk (CUDA) or
%% from `h0' (CPU) and runs the adjoint recurrence backwards in time. Its
%% scratch on CUDA is f32 sums for the gradients of `a', `b', `c', `d',
%% `dt_bias' (`(dim * dstate + 2 * dim + 2 * batch * seqlen * groups *
%% dstate) * 4' bytes); on the CPU `O(batch * dim * dstate)' plus small
%% per-task buffers. A context can serve more than one backward.
-spec selective_scan_backward(tensor(), scan_ctx(), #{dstate => tensor()}) -> scan_grads().
selective_scan_backward(Dy, Ctx, Opts) -> ?NIF:selective_scan_backward(Dy, Ctx, Opts).

%% @doc One time step of {@link selective_scan/6}, for inference one frame
%% at a time: `X', `Dt' `[batch, dim]'; `A' `[dim, dstate]'; `B', `C'
%% `[batch, dstate]' or `[batch, groups, dstate]'; options `d', `z'
%% (`[batch, dim]'), `dt_bias', `dt_softplus' as in the scan. Returns `Y'
%% `[batch, dim]' and updates `State' `[batch, dim, dstate]' in place (its
%% memory, so every view of it too). `State' must be `{f,32}' (or `{f,64}'
%% on `cpu'): the recurrence runs for as long as the stream does, and a
%% 16-bit state would lose its slow modes to rounding. On CUDA a step is
%% one kernel launch and allocates only `Y'.
-spec selective_scan_step(State :: tensor(), X :: tensor(), Dt :: tensor(), A :: tensor(),
                          B :: tensor(), C :: tensor(), scan_step_opts()) -> tensor().
selective_scan_step(State, X, Dt, A, B, C, Opts) ->
    ?NIF:selective_scan_step(State, X, Dt, A, B, C, Opts).
