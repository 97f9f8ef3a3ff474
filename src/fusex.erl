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
         byte_size/1, copy/3, to_pointer/2, to_pointer/3, from_pointer/4, copy_into/2]).

-export_type([tensor/0, type/0, shape/0, device/0, device_info/0, pointer/0,
              alloc_opts/0]).
-export([adamw_init/2, adamw_step/4, sgd_init/2, sgd_step/4, optimizer_info/1]).
-export_type([optimizer/0, adamw_opts/0, adamw_hyper/0, sgd_opts/0, sgd_hyper/0,
              optimizer_info/0]).

%% Linear recurrences (see docs/LINREC.md).
-export([linear_scan/2, linear_scan/3, mingru/2, mingru/3, minlstm/3, minlstm/4, liquid/3,
         liquid/4, linear_scan_backward/2, linear_scan_backward/3, mingru_backward/2,
         mingru_backward/3, minlstm_backward/2, minlstm_backward/3, liquid_backward/2,
         liquid_backward/3, linear_scan_step/3, linear_scan_step/4, mingru_step/3,
         mingru_step/4, minlstm_step/4, minlstm_step/5, liquid_step/4, liquid_step/5]).
-export_type([ctx/0, scan_opts/0, gated_opts/0, liquid_opts/0, scan_result/0,
              backward_opts/0, gradients/0]).

%% Selective scan (Mamba S6, see docs/SSM.md).
-export([selective_scan/6, selective_scan_backward/2, selective_scan_backward/3,
         selective_scan_step/7, selective_scan_saved_shape/3, selective_scan_save_every/3]).
-export_type([selective_scan_opts/0, selective_scan_step_opts/0, selective_scan_ctx/0,
              selective_scan_grads/0]).

%% The rest of a Mamba block: causal conv1d, the norms, linear layers (see docs/LAYERS.md).
-export([causal_conv1d/2, causal_conv1d/3, causal_conv1d_backward/2, causal_conv1d_backward/3,
         causal_conv1d_step/3, causal_conv1d_step/4, rms_norm/2, rms_norm/3, rms_norm_backward/2,
         rms_norm_backward/3, layer_norm/3, layer_norm/4, layer_norm_backward/2, layer_norm_backward/3,
         linear/2, linear/3, linear_backward/2, linear_backward/3]).
-export_type([conv_opts/0, conv_step_opts/0, conv_result/0, conv_ctx/0, conv_grads/0,
              norm_opts/0, layer_norm_opts/0, norm_result/0, norm_ctx/0, norm_grads/0,
              linear_opts/0, linear_ctx/0, linear_grads/0, activation/0]).

%% Classic GRU and LSTM, stacked (PyTorch's nn.GRU / nn.LSTM, batch first; see docs/RNN.md).
-export([gru/2, gru/3, gru_backward/2, gru_backward/3, gru_step/3, lstm/2, lstm/3,
         lstm_backward/2, lstm_backward/3, lstm_step/3]).
-export_type([rnn_layer/0, gru_opts/0, lstm_opts/0, rnn_ctx/0, rnn_grads/0]).

%% XLA custom-call targets (see docs/XLA.md).
-export([op_list/0, op_check/4, op_run/3]).
-export_type([op_description/0]).
-export([xla_register/0, xla_register/1]).

%% Resident models (see docs/MODELS.md).
-export([model/2, model/3, model_info/1, model_weights/1, model_params/1, model_init_state/2,
         model_reset_state/2, model_step/3, model_forward/2, model_forward/3, model_loss/4,
         model_gradients/4, model_optimizer/2, model_train_step/5]).
-export_type([model/0, model_state/0, model_spec/0, model_layer/0, model_weights/0,
              model_loss_opts/0, model_train_opts/0]).

-type tensor() :: reference().
%% A handle to a tensor resident on a device.
-type type() :: {f, 32} | {f, 64} | {bf, 16} | {f, 16} | {s, 32} | {s, 64} | {u, 8}.
%% Element types, spelled as Nx spells them.
-type shape() :: tuple().
%% A tuple of non-negative integers, row-major (as in Nx): `{Batch, SeqLen, Dim}'.
-type device() :: cpu | {cpu, reference} | cuda | {cuda, non_neg_integer()}.
%% `cuda' means `{cuda, 0}'. `cpu' runs the CPU backend's fast f32 kernels;
%% `{cpu, reference}' its f64-accumulating oracle (the reference the tests
%% compare every other path against: slower, for checking results). Both
%% are host memory; an op's tensors must all be on one of them.
-type device_info() :: #{id := device(), kind := cpu | cuda, name := binary(),
                         memory_total := non_neg_integer(),
                         memory_free := non_neg_integer(), atom() => term()}.

-type pointer() :: {local, Address :: non_neg_integer()}
                 | {local, Address :: non_neg_integer(), ByteSize :: non_neg_integer()}
                 | {ipc, Handle :: <<_:512>>}
                 | {ipc, Handle :: <<_:512>>, ByteSize :: non_neg_integer()}.
%% Memory named for another library: a local address (a host address on
%% `cpu', a device address on CUDA) or a 64-byte CUDA IPC handle
%% (`cudaIpcMemHandle_t'), optionally with the region's size in bytes.
-type alloc_opts() :: #{device => device(), ipc => boolean()}.
%% `ipc => true': allocate plain `cudaMalloc' memory that
%% {@link to_pointer/3} can export as an IPC handle (CUDA only; default
%% false: the device's stream-ordered pool, which has no IPC handles).

-define(NIF, fusex_nif).
%% The longest XLA library name the NIF takes: its path buffer (c_src/nif/xla_nif.c),
%% less the terminating NUL.
-define(XLA_LIBRARY_MAX_BYTES, 4095).

%% @doc The devices this node can use, CPU first: `cpu' (`path => fast',
%% the f32 kernels on their thread pool, `threads' of them), then
%% `{cpu, reference}' (`path => reference', the f64-accumulating oracle;
%% docs/CPU.md), then the CUDA devices. The `cpu' entry carries
%% `cuda_unavailable => Reason' when no CUDA device could be used (no
%% backend built, no driver, no GPU, or `FUSEX_DISABLE_CUDA' set); CUDA
%% entries carry `compute_capability' and `multiprocessors'.
-spec devices() -> [device_info()].
devices() -> ?NIF:devices().

%% @doc The device new tensors go to when no `device' option is given: the
%% application env `{fusex, default_device}' if set, else the `FUSEX_DEVICE'
%% environment variable (`cpu', `cpu:reference', `cuda', `cuda:N'), else the first CUDA
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
parse_env_device("cpu:reference") -> {cpu, reference};
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
    iolist_to_binary(["FUSEX_DEVICE: expected cpu, cpu:reference, cuda or cuda:N, got ", Value]).

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
%% stream order. `ipc => true': see {@link alloc_opts()}.
-spec tensor(binary(), type(), shape(), alloc_opts()) -> tensor().
tensor(Data, Type, Shape, Opts) ->
    {Device, Ipc} = alloc_opts(Opts),
    ?NIF:tensor(Data, Type, Shape, Device, Ipc).

%% @equiv zeros(Type, Shape, #{})
-spec zeros(type(), shape()) -> tensor().
zeros(Type, Shape) -> zeros(Type, Shape, #{}).

%% @doc A zero-filled tensor on `device' (default: {@link default_device/0}).
%% `ipc => true': see {@link alloc_opts()}.
-spec zeros(type(), shape(), alloc_opts()) -> tensor().
zeros(Type, Shape, Opts) ->
    {Device, Ipc} = alloc_opts(Opts),
    ?NIF:zeros(Type, Shape, Device, Ipc).

alloc_opts(Opts) ->
    check_opts(Opts, [device, ipc]),
    {maps:get(device, Opts, default_device()), maps:get(ipc, Opts, false)}.

check_opts(Opts, Allowed) when is_map(Opts) ->
    case maps:keys(Opts) -- Allowed of
        [] -> ok;
        Unknown -> erlang:error({badarg, unknown_opts(Unknown, Allowed)})
    end;
check_opts(Opts, _) ->
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

%% @equiv copy(T, Device, #{})
-spec copy(tensor(), device()) -> tensor().
copy(T, Device) -> copy(T, Device, #{}).

%% @doc A copy of the tensor on `Device' (which may be its own device).
%% `ipc => true' makes the copy exportable by {@link to_pointer/3} as an
%% IPC handle (see {@link alloc_opts()}).
-spec copy(tensor(), device(), #{ipc => boolean()}) -> tensor().
copy(T, Device, Opts) ->
    check_opts(Opts, [ipc]),
    ?NIF:copy(T, Device, maps:get(ipc, Opts, false)).

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

%% @equiv to_pointer(T, Kind, #{})
-spec to_pointer(tensor(), local | ipc) ->
          {local, non_neg_integer(), non_neg_integer()} | {ipc, <<_:512>>, non_neg_integer()}.
to_pointer(T, Kind) -> to_pointer(T, Kind, #{}).

%% @doc The tensor's memory, for another library or process, with its size
%% in bytes: `{local, Address, ByteSize}' (the address of the first element:
%% a host address on `cpu', a device address on CUDA; what EXLA's
%% `Nx.from_pointer/5' takes as `kind: :local') or `{ipc, Handle,
%% ByteSize}' (a 64-byte `cudaIpcMemHandle_t' of the tensor's own
%% allocation, so the importer maps it at offset 0; needs a tensor
%% allocated with `ipc => true').
%%
%% The memory stays fusex's: keep the tensor alive while others use it.
%% With `sync => true' (the default) the call first waits for the work
%% fusex has queued on the device, so a reader on another stream or in
%% another process sees final values. Memory whose address was handed out
%% is returned to the allocator only after a device-wide synchronize, so a
%% reader in this process that is still running is not raced.
-spec to_pointer(tensor(), local | ipc, #{sync => boolean()}) ->
          {local, non_neg_integer(), non_neg_integer()} | {ipc, <<_:512>>, non_neg_integer()}.
to_pointer(T, Kind, Opts) ->
    check_opts(Opts, [sync]),
    ?NIF:to_pointer(T, Kind, maps:get(sync, Opts, true)).

%% @doc A tensor over memory someone else owns: a borrowed view that fusex
%% never frees. Ops read and write it in place. Options:
%% <ul>
%% <li>`device' (default {@link default_device/0}): the device the memory
%% belongs to.</li>
%% <li>`sync' (default `true'): before the call returns, the whole device
%% is synchronized (`cudaDeviceSynchronize'), so work that other libraries
%% of this node (EXLA, ...) queued on their own streams is complete before
%% fusex first touches the memory. Pass `false' only when you have ordered
%% that work yourself. Work of another process is not covered: the exporter
%% must have finished writing before it sent the handle.</li>
%% <li>`offset' (ipc only, default 0): the byte offset of the tensor within
%% the allocation the handle names (an IPC handle always names a whole
%% allocation; PyTorch reports a storage's offset beside its handle).</li>
%% </ul>
%% Checks: a null address, one not aligned to the element size, or a
%% region smaller than the shape needs (when the pointer carries a size)
%% raise `badarg'. A local address inside a live fusex tensor must fit
%% inside it, and the view then keeps that memory alive; an address inside
%% memory fusex has freed is refused as a use-after-free. Foreign CUDA
%% addresses are checked to be memory of that device and, as far as the
%% driver reports, to hold the region. Foreign host addresses cannot be
%% checked beyond null and alignment. An IPC mapping is closed when the
%% view is freed or collected. See docs/INTEROP.md.
-spec from_pointer(pointer(), type(), shape(),
                   #{device => device(), sync => boolean(), offset => non_neg_integer()}) ->
          tensor().
from_pointer(Pointer, Type, Shape, Opts) ->
    check_opts(Opts, [device, sync, offset]),
    ?NIF:from_pointer(Pointer, Type, Shape, maps:get(device, Opts, default_device()),
                      maps:get(sync, Opts, true), maps:get(offset, Opts, 0)).

%% @doc Copies `Src' into `Dst' in place (same device, type and shape). The
%% way a result reaches memory fusex does not own: a view made by
%% {@link from_pointer/4} of another library's tensor. Stream-ordered like
%% every op; {@link synchronize/1} before another library reads `Dst'.
-spec copy_into(tensor(), tensor()) -> ok.
copy_into(Src, Dst) -> ?NIF:copy_into(Src, Dst).
%% ---- optimizers ----

-type optimizer() :: #{optimizer := adamw | sgd, ref := reference(), device := device(),
                       step := tensor(), grad_norm := tensor(), skipped := tensor(),
                       master := [tensor()], exp_avg => [tensor()], exp_avg_sq => [tensor()],
                       max_exp_avg_sq => [tensor()], momentum_buffer => [tensor()]}.
%% An optimizer state. Every tensor in it lives on the parameters' device
%% and is updated in place by each step; read them with {@link to_binary/1}
%% like any tensor. `step' ({s,64}, shape {}) counts the steps taken (a
%% skipped step does not count); `grad_norm' ({f,32}, {}) is the last
%% step's global gradient norm, -1 when that step computed none; `skipped'
%% ({u,8}, {}) is 1 when the last step was skipped. `master' holds the f32
%% master copies of 16-bit parameters (else `[]'). AdamW keeps `exp_avg',
%% `exp_avg_sq' and, with amsgrad, `max_exp_avg_sq' (else `[]'); SGD keeps
%% `momentum_buffer' (`[]' without momentum). All f32, one per parameter.
%% `ref' is the state itself (its device table and its own references to
%% every tensor above): steps and {@link optimizer_info/1} read the state
%% through it alone, so the map's tensors are views for inspection, and a
%% map whose tensors were replaced (or forged) reads and steps exactly as
%% the original. A step returns the map unchanged (the tensors in it
%% changed in place).

-type adamw_hyper() :: #{lr => number(), beta1 => number(), beta2 => number(),
                         eps => number(), weight_decay => number(), maximize => boolean(),
                         amsgrad => boolean(), max_grad_norm => number() | none,
                         skip_nonfinite => boolean()}.
%% AdamW hyperparameters; defaults as torch.optim.AdamW: `lr' 1.0e-3,
%% `beta1' 0.9, `beta2' 0.999, `eps' 1.0e-8, `weight_decay' 1.0e-2
%% (decoupled), `maximize' false, `amsgrad' false; `max_grad_norm' none
%% (no clipping), `skip_nonfinite' false.

-type adamw_opts() :: #{lr => number(), beta1 => number(), beta2 => number(),
                        eps => number(), weight_decay => number(), maximize => boolean(),
                        amsgrad => boolean(), max_grad_norm => number() | none,
                        skip_nonfinite => boolean(), master_weights => boolean()}.
%% {@link adamw_hyper()} (the defaults of every step) and `master_weights'.

-type sgd_hyper() :: #{lr => number(), momentum => number(), dampening => number(),
                       nesterov => boolean(), weight_decay => number(),
                       maximize => boolean(), max_grad_norm => number() | none,
                       skip_nonfinite => boolean()}.
%% SGD hyperparameters; defaults as torch.optim.SGD: `lr' 1.0e-3,
%% `momentum' 0, `dampening' 0, `nesterov' false, `weight_decay' 0,
%% `maximize' false; `max_grad_norm' none, `skip_nonfinite' false.

-type sgd_opts() :: #{lr => number(), momentum => number(), dampening => number(),
                      nesterov => boolean(), weight_decay => number(),
                      maximize => boolean(), max_grad_norm => number() | none,
                      skip_nonfinite => boolean(), master_weights => boolean()}.
%% {@link sgd_hyper()} (the defaults of every step) and `master_weights'.

-type optimizer_info() :: #{step := non_neg_integer(), skipped := boolean(),
                            grad_norm := float() | infinity | nan | undefined}.

%% @doc A new AdamW state for `Params' (a non-empty list of tensors on one
%% device, all of one type). Allocates, on that device, the first and
%% second moments (f32, zeroed), `max_exp_avg_sq' with `amsgrad => true',
%% and the step count (0). Parameters are f32; {bf,16} or {f,16}
%% parameters need `master_weights => true', which keeps an f32 master copy
%% of each (made from the parameters now): steps update the master and
%% write the parameter rounded from it; the master is the truth from then on
%% (a value written into the parameter otherwise is overwritten by the next
%% step). `master_weights' has no effect on f32 parameters.
%%
%% `Opts' are the hyperparameters every {@link adamw_step/4} starts from
%% (see {@link adamw_hyper()}); `amsgrad' is fixed here. The formulas are in
%% docs/OPTIMIZERS.md. Bad options raise `{badarg, Msg}' naming the
%% option, e.g. `<<"beta1: expected a number in [0, 1), got 1.5">>'.
-spec adamw_init([tensor()], adamw_opts()) -> optimizer().
adamw_init(Params, Opts) -> optimizer_init(adamw, Params, Opts).

%% @doc One AdamW step over every parameter, in place, exactly as
%% torch.optim.AdamW: `Params' are the tensors given to
%% {@link adamw_init/2} (same count, shapes and type; the same tensors in
%% practice), `Grads' one gradient per parameter, of its shape, all f32 or
%% all {bf,16} (or {f,16}). `Hyper' overrides the state's defaults for this
%% step (a learning-rate schedule passes `#{lr => Lr}').
%%
%% With `max_grad_norm => N' the gradients are scaled by
%% min(1, N / (Norm + 1.0e-6)), Norm the L2 norm of all gradients together
%% (torch.nn.utils.clip_grad_norm_); the gradients themselves are not
%% written. With `skip_nonfinite => true' a step whose gradients hold any
%% Inf or NaN changes nothing: parameters, master copies, moments and the
%% step count keep every byte.
%%
%% On a GPU the call only enqueues work (one kernel launch; two with
%% clipping or the non-finite check) and never waits for the device: the
%% step count, the norm, the clip factor and the skip verdict stay on the
%% device. Read them with {@link optimizer_info/1}, which waits. Returns
%% the state (the same map: its tensors changed in place).
-spec adamw_step(optimizer(), [tensor()], [tensor()], adamw_hyper()) -> optimizer().
adamw_step(State, Params, Grads, Hyper) -> optimizer_step(adamw, State, Params, Grads, Hyper).

%% @doc A new SGD state for `Params': momentum buffers (f32, one per
%% parameter) when `momentum' is above 0, the step count, and f32 master
%% copies for {bf,16}/{f,16} parameters with `master_weights => true', as
%% {@link adamw_init/2}. `Opts': the defaults of every step (see
%% {@link sgd_hyper()}).
-spec sgd_init([tensor()], sgd_opts()) -> optimizer().
sgd_init(Params, Opts) -> optimizer_init(sgd, Params, Opts).

%% @doc One SGD step (momentum, dampening, Nesterov, weight decay, as
%% torch.optim.SGD), with the clipping and non-finite skip of
%% {@link adamw_step/4} and the same rules for `Params' and `Grads'. The
%% momentum buffer starts as the first (non-skipped) step's gradient. A
%% state made with momentum 0 holds no buffers and refuses a step with
%% momentum.
-spec sgd_step(optimizer(), [tensor()], [tensor()], sgd_hyper()) -> optimizer().
sgd_step(State, Params, Grads, Hyper) -> optimizer_step(sgd, State, Params, Grads, Hyper).

%% @doc What the last step left on the device: the step count, the global
%% gradient norm (`undefined' when that step computed none: no clipping
%% and no non-finite check; `infinity' or `nan' when a gradient held one),
%% and whether it was skipped. Waits for the queued work on the state's
%% device; a training loop that does not call it never waits.
-spec optimizer_info(optimizer()) -> optimizer_info().
optimizer_info(#{optimizer := _, ref := Ref}) ->
    ?NIF:optim_info(Ref);
optimizer_info(Other) ->
    erlang:error({badarg, not_a_state(<<"adamw_init/2 or sgd_init/2">>, Other)}).

optimizer_init(Kind, Params, Opts) ->
    {Ref, Tensors} = ?NIF:optim_init(Kind, Params, Opts),
    Tensors#{optimizer => Kind, ref => Ref, device => device(hd(Params))}.

optimizer_step(Kind, State = #{optimizer := _, ref := Ref}, Params, Grads, Hyper) ->
    ok = ?NIF:optim_step(Kind, Ref, Params, Grads, Hyper),
    State;
optimizer_step(Kind, Other, _Params, _Grads, _Hyper) ->
    erlang:error({badarg, not_a_state([atom_to_list(Kind), "_init/2"], Other)}).

not_a_state(From, Got) ->
    iolist_to_binary(io_lib:format("state: expected an optimizer state from ~s, got ~0tP",
                                   [From, Got, 10])).

%% ---- linear recurrences ----
%%
%% Sequences are `[batch, seqlen, hidden]', states and h0 `[batch, hidden]'.
%% Every op is one fused scan: the per-step coefficients (a_t, b_t) of
%% h_t = a_t * h_{t-1} + b_t are computed from the inputs inside the kernel.
%% Inputs may be {f,32}, {bf,16} or {f,16} ({f,64} too on cpu), all of one
%% type; maths runs in f32 (f64 on cpu for f64 inputs). H comes back in the
%% inputs' type; the final state in {f,32} ({f,64} for f64 inputs), so a
%% sequence split in pieces and carried through `h0' gives the same result
%% as one call. `h0' and a step's state may be of the inputs' type or of the
%% state type.

-type ctx() :: reference().
%% What `save_for_backward' keeps for the backward: references to the
%% inputs, h0 and the output H (no copies) and the options.
-type scan_opts() :: #{h0 => tensor(), return_state => boolean(), reverse => boolean(),
                       save_for_backward => boolean()}.
%% `h0' (default zeros): the state before the first step. `return_state':
%% also return the final state. `reverse': scan from the last step to the
%% first (the final state is then the one after t = 0). `save_for_backward':
%% also return a context for the op's `_backward'.
-type gated_opts() :: #{h0 => tensor(), return_state => boolean(), reverse => boolean(),
                        save_for_backward => boolean(),
                        candidate_activation => identity | g}.
%% As {@type scan_opts()}, and `candidate_activation => g' to use
%% g(cand) (x + 0.5 for x >= 0, sigmoid(x) below) as the candidate.
-type liquid_opts() :: #{h0 => tensor(), return_state => boolean(), reverse => boolean(),
                         save_for_backward => boolean(), dt => number() | tensor()}.
%% As {@type scan_opts()}, and `dt': the step size, a positive number
%% (default 1.0) or a tensor `[batch, seqlen, 1]'.
-type scan_result() :: tensor() | {tensor(), tensor()} | {tensor(), ctx()}
                     | {tensor(), tensor(), ctx()}.
%% `H', `{H, State}' with `return_state', `{H, Ctx}' with
%% `save_for_backward', `{H, State, Ctx}' with both.
-type backward_opts() :: #{dstate => tensor()}.
%% `dstate': the gradient of the final state (default zeros).
-type gradients() :: #{atom() => tensor()}.
%% One gradient per input given to the forward, keyed by the input's name,
%% each of its input's shape and type.

%% @equiv linear_scan(A, B, #{})
-spec linear_scan(tensor(), tensor()) -> scan_result().
linear_scan(A, B) -> linear_scan(A, B, #{}).

%% @doc The generic linear scan h_t = a_t * h_{t-1} + b_t over
%% `[batch, seqlen, hidden]' tensors `A' and `B'.
-spec linear_scan(tensor(), tensor(), scan_opts()) -> scan_result().
linear_scan(A, B, Opts) -> ?NIF:op(linear_scan_fwd, [A, B], Opts).

%% @equiv mingru(ZLogits, Cand, #{})
-spec mingru(tensor(), tensor()) -> scan_result().
mingru(ZLogits, Cand) -> mingru(ZLogits, Cand, #{}).

%% @doc MinGRU: z = sigmoid(z_logits), h_t = (1 - z_t) * h_{t-1} + z_t * c_t,
%% with c = cand (or g(cand), see {@type gated_opts()}).
-spec mingru(tensor(), tensor(), gated_opts()) -> scan_result().
mingru(ZLogits, Cand, Opts) -> ?NIF:op(mingru_fwd, [ZLogits, Cand], Opts).

%% @equiv minlstm(FLogits, ILogits, Cand, #{})
-spec minlstm(tensor(), tensor(), tensor()) -> scan_result().
minlstm(FLogits, ILogits, Cand) -> minlstm(FLogits, ILogits, Cand, #{}).

%% @doc MinLSTM: f = sigmoid(f_logits), i = sigmoid(i_logits), normalised
%% f' = f/(f+i), i' = i/(f+i); h_t = f'_t * h_{t-1} + i'_t * c_t (c as in
%% {@link mingru/3}). The gates are computed in a form that stays finite for
%% any logits.
-spec minlstm(tensor(), tensor(), tensor(), gated_opts()) -> scan_result().
minlstm(FLogits, ILogits, Cand, Opts) -> ?NIF:op(minlstm_fwd, [FLogits, ILogits, Cand], Opts).

%% @equiv liquid(FLogits, Tau, A, #{})
-spec liquid(tensor(), tensor(), tensor()) -> scan_result().
liquid(FLogits, Tau, A) -> liquid(FLogits, Tau, A, #{}).

%% @doc Liquid time-constant cell, one fused semi-implicit Euler step per
%% frame: f = sigmoid(f_logits),
%% h_t = (h_{t-1} + dt * f_t * A) / (1 + dt * (1/tau + f_t)), with `Tau'
%% and `A' of shape `[hidden]'. Tau must be positive (its values are not
%% inspected: a zero or negative tau gives infinities, not an error).
-spec liquid(tensor(), tensor(), tensor(), liquid_opts()) -> scan_result().
liquid(FLogits, Tau, A, Opts) -> ?NIF:op(liquid_fwd, [FLogits, Tau, A], Opts).

%% @equiv linear_scan_backward(Dh, Ctx, #{})
-spec linear_scan_backward(tensor(), ctx()) -> gradients().
linear_scan_backward(Dh, Ctx) -> linear_scan_backward(Dh, Ctx, #{}).

%% @doc Gradients of {@link linear_scan/3} from `Dh' (the gradient of H)
%% and the context it saved: `#{a, b}', and `h0' if one was given.
-spec linear_scan_backward(tensor(), ctx(), backward_opts()) -> gradients().
linear_scan_backward(Dh, Ctx, Opts) -> ?NIF:op_backward(linear_scan_bwd, Dh, Ctx, Opts).

%% @equiv mingru_backward(Dh, Ctx, #{})
-spec mingru_backward(tensor(), ctx()) -> gradients().
mingru_backward(Dh, Ctx) -> mingru_backward(Dh, Ctx, #{}).

%% @doc Gradients of {@link mingru/3}: `#{z_logits, cand}', and `h0' if one
%% was given.
-spec mingru_backward(tensor(), ctx(), backward_opts()) -> gradients().
mingru_backward(Dh, Ctx, Opts) -> ?NIF:op_backward(mingru_bwd, Dh, Ctx, Opts).

%% @equiv minlstm_backward(Dh, Ctx, #{})
-spec minlstm_backward(tensor(), ctx()) -> gradients().
minlstm_backward(Dh, Ctx) -> minlstm_backward(Dh, Ctx, #{}).

%% @doc Gradients of {@link minlstm/4}: `#{f_logits, i_logits, cand}', and
%% `h0' if one was given.
-spec minlstm_backward(tensor(), ctx(), backward_opts()) -> gradients().
minlstm_backward(Dh, Ctx, Opts) -> ?NIF:op_backward(minlstm_bwd, Dh, Ctx, Opts).

%% @equiv liquid_backward(Dh, Ctx, #{})
-spec liquid_backward(tensor(), ctx()) -> gradients().
liquid_backward(Dh, Ctx) -> liquid_backward(Dh, Ctx, #{}).

%% @doc Gradients of {@link liquid/4}: `#{f_logits, tau, a}', `dt' when dt
%% was a tensor, and `h0' if one was given. The tau, a and dt gradients are
%% sums (over batch and time, or over hidden) accumulated with atomics on
%% CUDA, so their last bits may vary from run to run.
-spec liquid_backward(tensor(), ctx(), backward_opts()) -> gradients().
liquid_backward(Dh, Ctx, Opts) -> ?NIF:op_backward(liquid_bwd, Dh, Ctx, Opts).

%% @equiv linear_scan_step(State, A, B, #{})
-spec linear_scan_step(tensor(), tensor(), tensor()) -> tensor().
linear_scan_step(State, A, B) -> linear_scan_step(State, A, B, #{}).

%% @doc One frame of {@link linear_scan/3}: `A' and `B' are `[batch, hidden]';
%% `State' (`[batch, hidden]', the inputs' type or the state type) is
%% updated in place to the new h, which is also returned (in the inputs'
%% type). No options yet; the map is there for symmetry with the others.
-spec linear_scan_step(tensor(), tensor(), tensor(), #{}) -> tensor().
linear_scan_step(State, A, B, Opts) -> ?NIF:op(linear_scan_step, [State, A, B], Opts).

%% @equiv mingru_step(State, ZLogits, Cand, #{})
-spec mingru_step(tensor(), tensor(), tensor()) -> tensor().
mingru_step(State, ZLogits, Cand) -> mingru_step(State, ZLogits, Cand, #{}).

%% @doc One frame of {@link mingru/3}, `State' updated in place (see
%% {@link linear_scan_step/4}). Option: `candidate_activation'.
-spec mingru_step(tensor(), tensor(), tensor(), #{candidate_activation => identity | g}) -> tensor().
mingru_step(State, ZLogits, Cand, Opts) -> ?NIF:op(mingru_step, [State, ZLogits, Cand], Opts).

%% @equiv minlstm_step(State, FLogits, ILogits, Cand, #{})
-spec minlstm_step(tensor(), tensor(), tensor(), tensor()) -> tensor().
minlstm_step(State, FLogits, ILogits, Cand) -> minlstm_step(State, FLogits, ILogits, Cand, #{}).

%% @doc One frame of {@link minlstm/4}, `State' updated in place (see
%% {@link linear_scan_step/4}). Option: `candidate_activation'.
-spec minlstm_step(tensor(), tensor(), tensor(), tensor(),
                   #{candidate_activation => identity | g}) -> tensor().
minlstm_step(State, FLogits, ILogits, Cand, Opts) ->
    ?NIF:op(minlstm_step, [State, FLogits, ILogits, Cand], Opts).

%% @equiv liquid_step(State, FLogits, Tau, A, #{})
-spec liquid_step(tensor(), tensor(), tensor(), tensor()) -> tensor().
liquid_step(State, FLogits, Tau, A) -> liquid_step(State, FLogits, Tau, A, #{}).

%% @doc One frame of {@link liquid/4}, `State' updated in place (see
%% {@link linear_scan_step/4}). Option: `dt', a positive number (default
%% 1.0) or a tensor `[batch, 1]'.
-spec liquid_step(tensor(), tensor(), tensor(), tensor(), #{dt => number() | tensor()}) -> tensor().
liquid_step(State, FLogits, Tau, A, Opts) -> ?NIF:op(liquid_step, [State, FLogits, Tau, A], Opts).

%% ---- selective scan (Mamba S6) ----

-type selective_scan_opts() :: #{d => tensor(), z => tensor(), dt_bias => tensor(),
                       dt_softplus => boolean(), h0 => tensor(), return_state => boolean(),
                       save_for_backward => boolean()}.
%% Options of {@link selective_scan/6}; all default to absent / `false'.
-type selective_scan_step_opts() :: #{d => tensor(), z => tensor(), dt_bias => tensor(),
                            dt_softplus => boolean()}.
%% Options of {@link selective_scan_step/7}.
-opaque selective_scan_ctx() :: reference().
%% What a forward with `save_for_backward' keeps for
%% {@link selective_scan_backward/3}.
-type selective_scan_grads() :: #{x := tensor(), dt := tensor(), a := tensor(), b := tensor(),
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
%% f32 state entering every chunk of `K' steps after the first, of the shape
%% {@link selective_scan_saved_shape/3} gives: `batch * (ceil(seqlen / K)
%% - 1) * dim * dstate * 4' bytes, with `K = 16' up to `dstate = 32' and
%% where the backward runs as slices of 16 states, else 8 (docs/SSM.md).
%% For `dstate = 16' that is 4 bytes per element of `x'. The CPU keeps no
%% states: its backward recomputes from `h0'. Nothing of size `[batch,
%% seqlen, dim, dstate]' is ever held.
-spec selective_scan(X :: tensor(), Dt :: tensor(), A :: tensor(), B :: tensor(),
                     C :: tensor(), selective_scan_opts()) ->
          tensor() | {tensor(), tensor()} | {tensor(), selective_scan_ctx()} |
          {tensor(), tensor(), selective_scan_ctx()}.
selective_scan(X, Dt, A, B, C, Opts) -> ?NIF:op(selective_scan_fwd, [X, Dt, A, B, C], Opts).

%% @equiv selective_scan_backward(Dy, Ctx, #{})
-spec selective_scan_backward(tensor(), selective_scan_ctx()) -> selective_scan_grads().
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
-spec selective_scan_backward(tensor(), selective_scan_ctx(), #{dstate => tensor()}) ->
          selective_scan_grads().
selective_scan_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(selective_scan_bwd, Dy, Ctx, Opts).

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
                          B :: tensor(), C :: tensor(), selective_scan_step_opts()) -> tensor().
selective_scan_step(State, X, Dt, A, B, C, Opts) ->
    ?NIF:op(selective_scan_step, [State, X, Dt, A, B, C], Opts).

%% @doc The shape of the states a forward saves for its backward, from the
%% shapes of `X' (`{Batch, Seqlen, Dim}') and `B' (`{Batch, Seqlen, Dstate}'
%% or `{Batch, Seqlen, Groups, Dstate}') and the inputs' type alone:
%% `{Batch, NSaved, Dim, Dstate}', the state entering each chunk of `K'
%% steps after the first (`NSaved = max(ceil(Seqlen / K) - 1, 0)'). Their
%% type is the state type, `{f,32}' (`{f,64}' for `{f,64}' inputs). This
%% is the layout of the auxiliary output of the XLA custom call
%% `fusex_selective_scan_fwd' (docs/XLA.md), which a program sizes before
%% it runs.
-spec selective_scan_saved_shape(XShape :: shape(), BShape :: shape(), Type :: type()) ->
          {non_neg_integer(), non_neg_integer(), non_neg_integer(), pos_integer()}.
selective_scan_saved_shape(XShape, BShape, Type) ->
    ?NIF:ssm_saved_shape(XShape, BShape, Type).

%% @doc `K', the steps between the states a forward saves, from the same
%% arguments as {@link selective_scan_saved_shape/3}: the saved states are
%% the states after steps `K - 1', `2K - 1', ... before the last chunk. It
%% depends on `Dim', `Dstate', the groups and the type alone; a caller that
%% computes the saved states itself takes every `K'-th state.
-spec selective_scan_save_every(XShape :: shape(), BShape :: shape(), Type :: type()) -> pos_integer().
selective_scan_save_every(XShape, BShape, Type) ->
    ?NIF:ssm_save_every(XShape, BShape, Type).

%% ---------------------------------------------------------------------
%% The rest of a Mamba block: causal conv1d, the norms, linear layers
%% ---------------------------------------------------------------------
%%
%% docs/LAYERS.md has the equations, layouts and types. Every forward takes
%% `save_for_backward' (then a context comes last in its result, for the
%% op's `_backward'); every backward returns one gradient per input the
%% forward was given, keyed by the input's name, of its shape and type.

-type activation() :: none | relu | gelu | silu | tanh | sigmoid.
%% The pointwise activations (include/fusex_activation.h); gelu is the tanh
%% form. causal_conv1d takes `none' and `silu', linear all six.

-type conv_opts() :: #{bias => tensor(), activation => none | silu, initial_state => tensor(),
                       return_state => boolean(), save_for_backward => boolean()}.
%% `bias' `[dim]'; `activation' (default `none'); `initial_state' `[batch,
%% dim, width - 1]' (the inputs before the first, oldest first; default
%% zeros); `return_state': also return the final state (the last `width - 1'
%% inputs, oldest first); `save_for_backward': also return a context.
-type conv_step_opts() :: #{bias => tensor(), activation => none | silu}.
-type conv_result() :: tensor() | {tensor(), tensor()} | {tensor(), conv_ctx()}
                     | {tensor(), tensor(), conv_ctx()}.
%% `Y', `{Y, FinalState}' with `return_state', `{Y, Ctx}' with
%% `save_for_backward', `{Y, FinalState, Ctx}' with both.
-type conv_ctx() :: reference().
%% What a forward with `save_for_backward' keeps: references to its inputs
%% (no copies) and its options.
-type conv_grads() :: #{x := tensor(), w := tensor(), bias => tensor(), initial_state => tensor()}.

%% @equiv causal_conv1d(X, W, #{})
-spec causal_conv1d(tensor(), tensor()) -> conv_result().
causal_conv1d(X, W) -> causal_conv1d(X, W, #{}).

%% @doc The causal depthwise convolution over time of a Mamba block:
%% `X' `[batch, seqlen, dim]' (channels last), `W' `[dim, width]' (width 1
%% to 16),
%% ```
%% y_t[d] = act(bias[d] + sum_k W[d, k] * x_{t - (width - 1) + k}[d])
%% '''
%% so `W[:, width - 1]' multiplies the current input (causal-conv1d's and a
%% left-padded PyTorch conv1d's convention), and the inputs before the
%% first are the initial state's (zeros without one). Options: see
%% {@type conv_opts()}. `X', `Y' and the states share one type (`{f,32}',
%% `{bf,16}', `{f,16}'; `{f,64}' on `cpu'); `W' and `bias' any float type.
%% Sums are f32 on CUDA (f64 on the CPU).
-spec causal_conv1d(X :: tensor(), W :: tensor(), conv_opts()) -> conv_result().
causal_conv1d(X, W, Opts) -> ?NIF:op(causal_conv1d_fwd, [X, W], Opts).

%% @equiv causal_conv1d_backward(Dy, Ctx, #{})
-spec causal_conv1d_backward(tensor(), conv_ctx()) -> conv_grads().
causal_conv1d_backward(Dy, Ctx) -> causal_conv1d_backward(Dy, Ctx, #{}).

%% @doc The gradients of a {@link causal_conv1d/3} that ran with
%% `save_for_backward', from `Dy' (the gradient of `Y') and, optionally,
%% `dfinal_state' (the final state's, `[batch, dim, width - 1]'): `#{x, w}',
%% and `bias', `initial_state' where given. `w' and `bias' are summed over
%% batch and time in an order the shapes fix (deterministic: no float
%% atomics).
-spec causal_conv1d_backward(tensor(), conv_ctx(), #{dfinal_state => tensor()}) -> conv_grads().
causal_conv1d_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(causal_conv1d_bwd, Dy, Ctx, Opts).

%% @equiv causal_conv1d_step(State, Xt, W, #{})
-spec causal_conv1d_step(tensor(), tensor(), tensor()) -> tensor().
causal_conv1d_step(State, Xt, W) -> causal_conv1d_step(State, Xt, W, #{}).

%% @doc One time step of {@link causal_conv1d/3}, for inference a frame at a
%% time: `Xt' `[batch, dim]'; `State' `[batch, dim, width - 1]' (the last
%% `width - 1' inputs, oldest first: a forward's final state, or zeros) is
%% updated in place (the oldest input leaves, `Xt' enters). Returns `Yt'
%% `[batch, dim]'. Options `bias' and `activation'. One kernel launch on
%% CUDA; it allocates only `Yt'.
-spec causal_conv1d_step(State :: tensor(), Xt :: tensor(), W :: tensor(), conv_step_opts()) -> tensor().
causal_conv1d_step(State, Xt, W, Opts) -> ?NIF:op(causal_conv1d_step, [State, Xt, W], Opts).

%% ---- GRU and LSTM ----

-type rnn_layer() :: #{w_ih := tensor(), w_hh := tensor(), b_ih := tensor(), b_hh := tensor()}.
%% One layer's parameters in PyTorch's layout, `G' gate blocks of `hidden'
%% rows (GRU: 3, r z n; LSTM: 4, i f g o): `w_ih' `[G*hidden, input]' (layer
%% 0; `[G*hidden, hidden]' above), `w_hh' `[G*hidden, hidden]', `b_ih',
%% `b_hh' `[G*hidden]'.
-type gru_opts() :: #{h0 => tensor(), return_state => boolean(), save_for_backward => boolean()}.
%% `h0' `[layers, batch, hidden]' (zeros when absent); `return_state': also
%% return `h_n'; `save_for_backward': also return a context for
%% {@link gru_backward/3}.
-type lstm_opts() :: #{h0 => tensor(), c0 => tensor(), return_state => boolean(),
                       save_for_backward => boolean()}.
%% As {@link gru_opts()}, with the cell state `c0' `[layers, batch, hidden]'.
-opaque rnn_ctx() :: reference().
%% What a forward with `save_for_backward' keeps for its backward.
-type rnn_grads() :: #{x := tensor(), h0 => tensor(), c0 => tensor(),
                       layers := [#{w_ih := tensor(), w_hh := tensor(), b_ih := tensor(),
                                    b_hh := tensor()}]}.
%% Every gradient of a forward: `x', `h0' and `c0' where given, and per layer
%% its parameters' (summed over batch and time), each with its input's
%% shape and type.

%% @equiv gru(X, Layers, #{})
-spec gru(tensor(), [rnn_layer()]) -> tensor().
gru(X, Layers) -> gru(X, Layers, #{}).

%% @doc A stacked GRU over a whole sequence, as PyTorch's `nn.GRU' with
%% `batch_first=True': per layer, with `ax = W_ih x_t + b_ih' and
%% `ah = W_hh h_{t-1} + b_hh' in gate blocks r, z, n,
%% ```
%% r = sigmoid(ax_r + ah_r)   z = sigmoid(ax_z + ah_z)
%% n = tanh(ax_n + r * ah_n)  h_t = (1 - z) * n + z * h_{t-1}
%% '''
%% each layer above the first reading the one below's `h_t' as its `x_t'.
%%
%% `X' `[batch, seqlen, input]'; `Layers' one {@link rnn_layer()} per layer
%% (at least one). Returns `Y' `[batch, seqlen, hidden]' (the last layer's
%% `h_t', `X''s type); `{Y, Hn}' with `return_state' (`Hn' `[layers, batch,
%% hidden]'); `{Y, Ctx}' with `save_for_backward', `{Y, Hn, Ctx}' with both.
%%
%% Types: `X' and every `w_ih', `w_hh' share one type, `{f,32}', `{bf,16}' or
%% `{f,16}' (also `{f,64}' on `cpu'); biases and `h0' any float type. The
%% states are `{f,32}' (`{f,64}' for `{f,64}' inputs). A training forward
%% keeps `[layers, batch, seqlen, 5*hidden]' states of that type (the gates
%% and `h_t': the backward recomputes nothing step by step) and references
%% to its inputs (do not update them in place before the backward).
-spec gru(X :: tensor(), Layers :: [rnn_layer()], gru_opts()) ->
          tensor() | {tensor(), tensor()} | {tensor(), rnn_ctx()} | {tensor(), tensor(), rnn_ctx()}.
gru(X, Layers, Opts) -> ?NIF:op(gru_fwd, [X, Layers], Opts).

%% @equiv lstm(X, Layers, #{})
-spec lstm(tensor(), [rnn_layer()]) -> tensor().
lstm(X, Layers) -> lstm(X, Layers, #{}).

%% @doc A stacked LSTM over a whole sequence, as PyTorch's `nn.LSTM' with
%% `batch_first=True' (gate blocks i, f, g, o):
%% ```
%% i = sigmoid(ax_i + ah_i)   f = sigmoid(ax_f + ah_f)
%% g = tanh(ax_g + ah_g)      o = sigmoid(ax_o + ah_o)
%% c_t = f * c_{t-1} + i * g  h_t = o * tanh(c_t)
%% '''
%% As {@link gru/3}, with the cell state: options `h0', `c0'; `{Y, {Hn, Cn}}'
%% with `return_state' (`{Y, Ctx}', `{Y, {Hn, Cn}, Ctx}' with
%% `save_for_backward'). A training forward keeps `[layers, batch, seqlen,
%% 6*hidden]' states.
-spec lstm(X :: tensor(), Layers :: [rnn_layer()], lstm_opts()) ->
          tensor() | {tensor(), {tensor(), tensor()}} | {tensor(), rnn_ctx()} |
          {tensor(), {tensor(), tensor()}, rnn_ctx()}.
lstm(X, Layers, Opts) ->
    case ?NIF:op(lstm_fwd, [X, Layers], Opts) of
        {Y, Hn, Cn, Ctx} -> {Y, {Hn, Cn}, Ctx};
        {Y, Hn, Cn} -> {Y, {Hn, Cn}};
        Result -> Result
    end.

%% @equiv gru_backward(Dy, Ctx, #{})
-spec gru_backward(tensor(), rnn_ctx()) -> rnn_grads().
gru_backward(Dy, Ctx) -> gru_backward(Dy, Ctx, #{}).

%% @doc Every gradient of a {@link gru/3} that ran with `save_for_backward',
%% from `Dy' (`Y''s gradient: its shape and type) and, optionally, `dh_n'
%% (the final state's, `[layers, batch, hidden]', any float type): `x', `h0'
%% where given, and `layers', one map of `w_ih', `w_hh', `b_ih', `b_hh' per
%% layer. A context can serve more than one backward.
-spec gru_backward(tensor(), rnn_ctx(), #{dh_n => tensor()}) -> rnn_grads().
gru_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(gru_bwd, Dy, Ctx, Opts).

%% @equiv lstm_backward(Dy, Ctx, #{})
-spec lstm_backward(tensor(), rnn_ctx()) -> rnn_grads().
lstm_backward(Dy, Ctx) -> lstm_backward(Dy, Ctx, #{}).

%% @doc As {@link gru_backward/3} for {@link lstm/3}: options `dh_n' and
%% `dc_n'; `c0''s gradient where it was given.
-spec lstm_backward(tensor(), rnn_ctx(), #{dh_n => tensor(), dc_n => tensor()}) -> rnn_grads().
lstm_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(lstm_bwd, Dy, Ctx, Opts).

%% @doc One frame of {@link gru/3} through every layer: `H' `[layers, batch,
%% hidden]' (`{f,32}'; `{f,64}' for `{f,64}' inputs: a forward's `Hn', or
%% zeros) is read as `h_{t-1}' and updated in place to `h_t'; `Xt' `[batch,
%% input]'. Returns `{Yt, H}': `Yt' `[batch, hidden]' (the last layer's
%% `h_t', `Xt''s type) and `H' itself, updated. A chain of steps equals the
%% forward over the sequence.
-spec gru_step(H :: tensor(), Xt :: tensor(), Layers :: [rnn_layer()]) -> {tensor(), tensor()}.
gru_step(H, Xt, Layers) -> {?NIF:op(gru_step, [H, Xt, Layers], #{}), H}.

%% @doc One frame of {@link lstm/3}: as {@link gru_step/3} with the states
%% `{H, C}', both updated in place. Returns `{Yt, {H, C}}'.
-spec lstm_step({H :: tensor(), C :: tensor()}, Xt :: tensor(), Layers :: [rnn_layer()]) ->
          {tensor(), {tensor(), tensor()}}.
lstm_step({H, C}, Xt, Layers) -> {?NIF:op(lstm_step, [H, C, Xt, Layers], #{}), {H, C}};
lstm_step(State, _Xt, _Layers) ->
    erlang:error({badarg, iolist_to_binary(["state: expected a tuple {H, C} of two tensors, got ",
                                            io_lib:format("~0tp", [State])])}).

-type norm_opts() :: #{bias => tensor(), residual => tensor(), gate => tensor(), eps => number(),
                       residual_in_f32 => boolean(), save_for_backward => boolean()}.
%% `bias' `[hidden]' (rms_norm; layer_norm takes it as an argument);
%% `residual' `[..., hidden]': normalise `s = x + residual' and return `s'
%% too (what the next block adds to), in the residual's type or, with
%% `residual_in_f32', f32; `gate' `[..., hidden]': `y * silu(gate)'
%% (Mamba-2's gated norm); `eps' (default 1.0e-5, finite and >= 0);
%% `save_for_backward': also return a context (it keeps the statistics).
-type layer_norm_opts() :: #{residual => tensor(), gate => tensor(), eps => number(),
                             residual_in_f32 => boolean(), save_for_backward => boolean()}.
-type norm_result() :: tensor() | {tensor(), tensor()} | {tensor(), norm_ctx()}
                     | {tensor(), tensor(), norm_ctx()}.
%% `Y', `{Y, S}' with a `residual', `{Y, Ctx}' with `save_for_backward',
%% `{Y, S, Ctx}' with both.
-type norm_ctx() :: reference().
%% What a forward with `save_for_backward' keeps: references to its inputs
%% and to `S', and the statistics (`[rows]' f32, `rows' the product of x's
%% leading dimensions: rstd, and layer_norm's mean).
-type norm_grads() :: #{x := tensor(), weight := tensor(), bias => tensor(), residual => tensor(),
                        gate => tensor()}.

%% @equiv rms_norm(X, Weight, #{})
-spec rms_norm(tensor(), tensor()) -> norm_result().
rms_norm(X, Weight) -> rms_norm(X, Weight, #{}).

%% @doc RMSNorm over the last dimension, fused with the residual add before
%% it and the gate after it: `s = x + residual' (x without one), `y =
%% s / sqrt(mean(s^2) + eps) * weight + bias', times `silu(gate)' with a
%% gate. `X' `[..., hidden]', `Weight' `[hidden]'. Options: see
%% {@type norm_opts()}. `X', `gate' and `Y' share one type (`{f,32}',
%% `{bf,16}', `{f,16}'; `{f,64}' on `cpu'); the residual is of `X''s type
%% or `{f,32}'; weight and bias any float type. The statistics are f32
%% (f64 for f64 inputs), from `s' before it is rounded.
-spec rms_norm(X :: tensor(), Weight :: tensor(), norm_opts()) -> norm_result().
rms_norm(X, Weight, Opts) -> ?NIF:op(rms_norm_fwd, [X, Weight], Opts).

%% @equiv rms_norm_backward(Dy, Ctx, #{})
-spec rms_norm_backward(tensor(), norm_ctx()) -> norm_grads().
rms_norm_backward(Dy, Ctx) -> rms_norm_backward(Dy, Ctx, #{}).

%% @doc The gradients of a {@link rms_norm/3} that ran with
%% `save_for_backward', from `Dy' and, optionally, `ds' (the gradient that
%% reached `S' from the next block, of `S''s type): `#{x, weight}', and
%% `bias', `residual', `gate' where given (`x' and `residual' get the same
%% gradient). `weight' and `bias' are summed over the rows in a fixed order.
-spec rms_norm_backward(tensor(), norm_ctx(), #{ds => tensor()}) -> norm_grads().
rms_norm_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(rms_norm_bwd, Dy, Ctx, Opts).

%% @equiv layer_norm(X, Weight, Bias, #{})
-spec layer_norm(tensor(), tensor(), tensor()) -> norm_result().
layer_norm(X, Weight, Bias) -> layer_norm(X, Weight, Bias, #{}).

%% @doc LayerNorm over the last dimension, fused as {@link rms_norm/3}:
%% `y = (s - mean(s)) / sqrt(var(s) + eps) * weight + bias', times
%% `silu(gate)' with a gate; `Bias' `[hidden]' (zeros for a norm without
%% one). Options and types as {@link rms_norm/3}'s (`bias' is the argument).
-spec layer_norm(X :: tensor(), Weight :: tensor(), Bias :: tensor(), layer_norm_opts()) -> norm_result().
layer_norm(X, Weight, Bias, Opts) -> ?NIF:op(layer_norm_fwd, [X, Weight, Bias], Opts).

%% @equiv layer_norm_backward(Dy, Ctx, #{})
-spec layer_norm_backward(tensor(), norm_ctx()) -> norm_grads().
layer_norm_backward(Dy, Ctx) -> layer_norm_backward(Dy, Ctx, #{}).

%% @doc The gradients of a {@link layer_norm/4} that ran with
%% `save_for_backward', as {@link rms_norm_backward/3}'s: `#{x, weight,
%% bias}', and `residual', `gate' where given.
-spec layer_norm_backward(tensor(), norm_ctx(), #{ds => tensor()}) -> norm_grads().
layer_norm_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(layer_norm_bwd, Dy, Ctx, Opts).

-type linear_opts() :: #{bias => tensor(), activation => activation(), allow_tf32 => boolean(),
                         save_for_backward => boolean()}.
%% `bias' `[out]'; `activation' (default `none'); `allow_tf32' (f32 products
%% on TF32 tensor cores; default false: exact f32); `save_for_backward':
%% also return a context.
-type linear_ctx() :: reference().
%% What a forward with `save_for_backward' keeps: references to its inputs
%% and to what the activation's derivative reads, `Y' (relu, tanh,
%% sigmoid) or the pre-activation (gelu, silu: `[..., out]' of `X''s type,
%% which the forward then also writes).
-type linear_grads() :: #{x := tensor(), w := tensor(), bias => tensor()}.

%% @equiv linear(X, W, #{})
-spec linear(tensor(), tensor()) -> tensor() | {tensor(), linear_ctx()}.
linear(X, W) -> linear(X, W, #{}).

%% @doc A linear layer, `y = act(x W^T + bias)' over the last dimension of
%% `X' `[..., in]', with `W' `[out, in]' (PyTorch's layout: Axon's kernel
%% transposed); `Y' `[..., out]'. On CUDA one cuBLASLt product with the bias
%% and the activation as its epilogue (a kernel of fusex's where cuBLASLt
%% has none); exact f32 unless `allow_tf32', bf16 and f16 on tensor cores
%% accumulating in f32. `X', `W' and `Y' share one type; the bias any float
%% type. For Erlang and eager Elixir: inside XLA programs XLA's own
%% products are the right ones, and this op is no XLA target. Returns `Y',
%% or `{Y, Ctx}' with `save_for_backward'.
-spec linear(X :: tensor(), W :: tensor(), linear_opts()) -> tensor() | {tensor(), linear_ctx()}.
linear(X, W, Opts) -> ?NIF:op(linear_fwd, [X, W], Opts).

%% @equiv linear_backward(Dy, Ctx, #{})
-spec linear_backward(tensor(), linear_ctx()) -> linear_grads().
linear_backward(Dy, Ctx) -> linear_backward(Dy, Ctx, #{}).

%% @doc The gradients of a {@link linear/3} that ran with
%% `save_for_backward', from `Dy' `[..., out]': `#{x, w}', and `bias' where
%% given (`dx = dpre W', `dw = dpre^T x', `dbias' the column sums of `dpre',
%% in a fixed order). No options yet; the map is there for symmetry.
-spec linear_backward(tensor(), linear_ctx(), #{}) -> linear_grads().
linear_backward(Dy, Ctx, Opts) -> ?NIF:op_backward(linear_bwd, Dy, Ctx, Opts).

%% ---------------------------------------------------------------------
%% The ops' descriptions
%% ---------------------------------------------------------------------

-type op_description() :: #{index := non_neg_integer(), name := atom(), op := atom(),
                            family := atom(), dir := fwd | bwd | step, target => binary(),
                            attrs := [map()], inputs := [map()], results := [map()],
                            options := [atom()], backward => atom(), saved_by => binary()}.
%% One op as the op layer describes it (`c_src/core/op.h'): `name'
%% (`mingru_fwd'), the XLA `target' (`<<"fusex_mingru_fwd">>'; none for an
%% op that is no XLA target, the linear layers), its attributes (`#{name,
%% kind => flag | number | enum, role => option | presence | save, default,
%% positive}', with `option' (the public option's name where it differs)
%% and `choices' (a flag given as one of two atoms, an enum as one of its
%% atoms; an enum's `default' is an index into them) where they apply), its
%% inputs and results in the XLA binder's order (`#{name,
%% layout => binary(), role => arg | option | state | forward | saved |
%% cotangent | output | grad, presence => always | flag | rule, kept}', with
%% `flag', the attribute announcing it, where `presence' is `flag'), the
%% public functions' `options' in order, and for a forward with a backward
%% the `backward' and what its contexts are called (`saved_by').

%% @doc Every op fusex computes, as the op layer describes it, in the
%% order of docs/XLA.md. The Elixir and JAX front ends enumerate it.
-spec op_list() -> [op_description()].
op_list() -> ?NIF:op_list().

%% @doc The op layer's check of a call of op `Name' (an `op_list/0' name,
%% `mingru_fwd') on shapes and types alone, for `Device': `Inputs' maps
%% input names to `{Type, Shape}', `Attrs' attribute names (or their
%% option names) to numbers, booleans, a flag's choices or an enum's
%% (an index or an atom; defaults where left out; presence attributes
%% follow from the inputs given). Returns
%% each result the call would have with its type and shape, or `{badarg,
%% Msg}' with the message a run of the op would raise.
-spec op_check(Name :: atom(), Inputs :: #{atom() => {type(), shape()}},
               Attrs :: #{atom() => number() | boolean() | atom()}, device()) ->
          #{atom() => {type(), shape()}} | {badarg, binary()}.
op_check(Name, Inputs, Attrs, Device) -> ?NIF:op_check(Name, Inputs, Attrs, Device).

%% @doc Runs op `Name' (any `op_list/0' name: a forward, a backward or a
%% step) on its inputs by name, with its attributes as `op_check/4' takes
%% them (defaults where left out; presence attributes follow from the
%% inputs given): the stateless call an XLA program makes, which
%% `Fusex.Defn' makes where no XLA is. Returns every result present, by
%% name; a step's `new_state' is its `state' input, updated in place. The
%% device is the inputs'.
-spec op_run(Name :: atom(), Inputs :: #{atom() => tensor()},
             Attrs :: #{atom() => number() | boolean() | atom()}) -> #{atom() => tensor()}.
op_run(Name, Inputs, Attrs) when is_map(Inputs) ->
    {Names, Tensors} = lists:unzip(maps:to_list(Inputs)),
    ?NIF:op_run(Name, Names, Tensors, Attrs);
op_run(_Name, Other, _Attrs) ->
    erlang:error({badarg, iolist_to_binary(io_lib:format("inputs: expected a map of input names to tensors, "
                                                          "got ~0tP", [Other, 10]))}).

%% ---------------------------------------------------------------------
%% XLA custom-call targets
%% ---------------------------------------------------------------------

%% @doc Registers fusex's XLA custom-call targets (`fusex_<op>_<fwd|bwd|step>',
%% docs/XLA.md) for the platforms `Host' and `CUDA' with the XLA that EXLA
%% loaded in this VM (`libxla_extension.so'), so that compiled programs
%% (EXLA's `Nx.block' custom calls) can call fusex's kernels. Call it after
%% EXLA is loaded and before the first compilation that uses a target.
%% Registering again is `ok' and does nothing; safe from any process.
%%
%% Returns `{error, Reason}' where no XLA is loaded yet (EXLA not started),
%% where `priv/fusex_xla.so' was not built (`make' says why), or where XLA
%% refuses a target.
-spec xla_register() -> ok | {error, Reason :: binary()}.
xla_register() -> ?NIF:xla_register(undefined).

%% @doc As {@link xla_register/0}, with the XLA in `Library': the path or
%% soname of an XLA library already loaded in this VM (it is looked up,
%% never loaded), which exports `XLA_FFI_GetApi' or
%% `xla::ffi::GetXlaFfiApi()'; at most 4095 bytes as UTF-8.
-spec xla_register(Library :: file:filename_all()) -> ok | {error, Reason :: binary()}.
xla_register(Library) ->
    Bin = try unicode:characters_to_binary(Library) catch error:_ -> error end,
    case is_binary(Bin) andalso Bin =/= <<>> andalso binary:match(Bin, <<0>>) =:= nomatch of
        true when erlang:byte_size(Bin) > ?XLA_LIBRARY_MAX_BYTES ->
            erlang:error({badarg, library_too_long(Bin)});
        true -> ?NIF:xla_register(Bin);
        false -> erlang:error({badarg, bad_library(Library)})
    end.

bad_library(Library) ->
    iolist_to_binary(io_lib:format("library: expected the path or soname of a loaded XLA library, got ~0tP",
                                   [Library, 10])).

library_too_long(Bin) ->
    iolist_to_binary(io_lib:format("library: expected a path or soname of at most ~B bytes, got one of ~B bytes",
                                   [?XLA_LIBRARY_MAX_BYTES, erlang:byte_size(Bin)])).

%% ---- resident models (see docs/MODELS.md) ----


-type model() :: reference().
%% A model resident on one device: its layers' weights (owned by the model,
%% updated in place by {@link model_train_step/5}) and their gradients.
-type model_state() :: reference().
%% The recurrent states of one batch of a model, with the buffers a frame
%% needs: updated in place by {@link model_step/3} and
%% {@link model_forward/3}.
-type model_layer() :: {linear, #{out := pos_integer(), activation => activation(),
                                  bias => boolean(), residual => boolean()}}
                     | {rms_norm | layer_norm, #{eps => number(), bias => boolean(),
                                                 residual => boolean()}}
                     | rms_norm | layer_norm
                     | {mingru | minlstm | gru | lstm, #{hidden := pos_integer(), bias => boolean(),
                                                         residual => boolean()}}
                     | {mamba, #{expand => pos_integer(), d_state => pos_integer(),
                                 d_conv => pos_integer(), dt_rank => pos_integer(),
                                 residual => boolean()}}
                     | mamba.
%% One layer. `bias' defaults to true (`layer_norm''s bias; rms_norm has
%% none), `eps' to 1.0e-5, `activation' to `none'. A Mamba block keeps its
%% input's width (d_model): d_inner = `expand' (2) times it, `d_state' 16,
%% `d_conv' 4, `dt_rank' ceil(d_model / 16). `residual => true' adds the
%% layer's input to its output (the widths must agree).
-type model_spec() :: #{input := pos_integer(), layers := [model_layer(), ...],
                        type => {f, 32} | {f, 64}, seed => integer(), graph => boolean()}.
%% `input': the frame's width. `type': {f,32} (default), or {f,64} on the
%% CPU. `seed': the initial weights of {@link model/2} (default 0).
%% `graph': on CUDA, each state's frame is captured once into a CUDA graph
%% and replayed (default true; `false': plain launches).
-type model_weights() :: [#{atom() => tensor() | binary()}].
%% One map per layer, weight name to a tensor (copied onto the model's
%% device) or a binary of the model's type in native byte order: linear
%% `w' [out, in], `b' [out]; rms_norm `weight' [in]; layer_norm `weight',
%% `bias'; mingru `w_z', `b_z', `w_h', `b_h' ([hidden, in], [hidden]);
%% minlstm the same with `w_f', `b_f', `w_i', `b_i', `w_h', `b_h'; gru and
%% lstm `w_ih' [G*hidden, in], `w_hh' [G*hidden, hidden], `b_ih', `b_hh'
%% [G*hidden] (G = 3 or 4, PyTorch's gate order); mamba `w_in_x', `w_in_z',
%% `w_conv', `b_conv', `w_x_dt', `w_x_b', `w_x_c', `w_dt', `b_dt', `a', `d',
%% `w_out' (docs/MODELS.md gives their shapes).
-type model_loss_opts() :: #{loss => mse | cross_entropy}.
%% `mse' (default): targets shaped as the outputs. `cross_entropy': the
%% outputs are logits, targets {s,32} `{Batch, SeqLen}' class indices.
-type model_train_opts() :: #{loss => mse | cross_entropy, lr => number()}.
%% The loss, and the learning rate of this step (default: the optimizer's).

%% @doc A model on `Device' built from `Spec', its weights initialized
%% from the spec's seed (uniform in +-1/sqrt(fan_in), norms 1 and 0).
%% Bad specs raise `{badarg, Msg}' naming the layer, e.g.
%% `<<"layers[1] (gru): hidden: expected an integer >= 1, got 0">>'.
-spec model(device(), model_spec()) -> model().
model(Device, Spec) -> ?NIF:model_new(Device, Spec, none).

%% @doc A model with the given weights (see {@link model_weights()}), each
%% checked: `<<"layers[0].w: expected shape {16,4} ([out, in]), got {4,16}">>'.
-spec model(device(), model_spec(), model_weights()) -> model().
model(Device, Spec, Weights) -> ?NIF:model_new(Device, Spec, Weights).

%% @doc The model's device, type, widths, parameter count and layers, and
%% how a frame is enqueued: `frame => graph' (a CUDA graph per state,
%% replayed) or `launches', with `frame_why' saying why (the CPU, `graph =>
%% false', a capture that failed).
-spec model_info(model()) -> #{device := device(), type := type(), input := pos_integer(),
                               output := pos_integer(), params := non_neg_integer(),
                               layers := [map()], frame := graph | launches,
                               frame_why => binary()}.
model_info(Model) -> ?NIF:model_info(Model).

%% @doc The weights as {@link model/3} takes them: tensors sharing the
%% model's memory (training changes them in place).
-spec model_weights(model()) -> model_weights().
model_weights(Model) -> ?NIF:model_weights(Model).

%% @doc Every parameter in the optimizer's order (layer by layer, as
%% {@link model_weights()} lists them, absent biases left out), sharing
%% the model's memory.
-spec model_params(model()) -> [tensor()].
model_params(Model) -> ?NIF:model_params(Model).

%% @doc A state of zeros for `Batch' rows, with every buffer a frame of
%% that batch needs (after this call a frame allocates only its output).
-spec model_init_state(model(), pos_integer()) -> model_state().
model_init_state(Model, Batch) -> ?NIF:model_init_state(Model, Batch).

%% @doc Zeros the state's recurrences again (a new episode).
-spec model_reset_state(model(), model_state()) -> ok.
model_reset_state(Model, State) -> ?NIF:model_reset_state(Model, State).

%% @doc One frame `{Batch, Input}' through every layer: returns the output
%% `{Batch, Output}' and the state, whose recurrences were updated in place
%% (the same term). On CUDA the frame's kernels are enqueued in order on
%% the device's stream and the call returns without waiting.
-spec model_step(model(), model_state(), tensor()) -> {tensor(), model_state()}.
model_step(Model, State, Frame) -> {?NIF:model_step(Model, State, Frame), State}.

%% @doc A window `{Batch, SeqLen, Input}' from zero states: the outputs
%% `{Batch, SeqLen, Output}' and a new state holding the final states.
-spec model_forward(model(), tensor()) -> {tensor(), model_state()}.
model_forward(Model, Window) ->
    State = model_init_state(Model, window_batch(Window)),
    model_forward(Model, Window, State).

%% The window's batch where it has one; the NIF names what else is wrong.
window_batch(Window) ->
    case shape(Window) of
        {Batch, _, _} when Batch >= 1 -> Batch;
        _ -> 1
    end.

%% @doc A window from `State' (updated in place to the state after it).
-spec model_forward(model(), tensor(), model_state()) -> {tensor(), model_state()}.
model_forward(Model, Window, State) -> {?NIF:model_forward(Model, State, Window), State}.

%% @doc The loss of a window `Inputs' (from zero states) against `Targets'.
-spec model_loss(model(), tensor(), tensor(), model_loss_opts()) -> float().
model_loss(Model, Inputs, Targets, Opts) ->
    ?NIF:model_gradients(Model, Inputs, Targets, loss_opt(Opts), false).

%% @doc The loss and every parameter's gradient (in {@link model_params/1}'s
%% order): the model's resident gradients, overwritten by the next call.
-spec model_gradients(model(), tensor(), tensor(), model_loss_opts()) -> {float(), [tensor()]}.
model_gradients(Model, Inputs, Targets, Opts) ->
    ?NIF:model_gradients(Model, Inputs, Targets, loss_opt(Opts), true).

%% @doc An AdamW state over the model's parameters ({@link adamw_init/2}).
-spec model_optimizer(model(), adamw_opts()) -> optimizer().
model_optimizer(Model, Opts) -> adamw_init(model_params(Model), Opts).

%% @doc One training step: the forward over `Inputs' saving what the
%% backward reads, the loss against `Targets', the backward through every
%% layer, and the optimizer's fused step on the resident weights (AdamW
%% from {@link model_optimizer/2}, or any {@link adamw_init/2} or
%% {@link sgd_init/2} state over {@link model_params/1}). Returns the loss.
-spec model_train_step(model(), optimizer(), tensor(), tensor(), model_train_opts()) -> float().
model_train_step(Model, #{optimizer := _, ref := Ref}, Inputs, Targets, Opts) ->
    ?NIF:model_train_step(Model, Ref, Inputs, Targets, Opts);
model_train_step(_Model, Other, _Inputs, _Targets, _Opts) ->
    erlang:error({badarg, not_a_state(<<"adamw_init/2, sgd_init/2 or model_optimizer/2">>, Other)}).

loss_opt(Opts) when is_map(Opts) ->
    check_opts(Opts, [loss]),
    maps:get(loss, Opts, mse);
loss_opt(Other) ->
    erlang:error({badarg, iolist_to_binary(io_lib:format("opts: expected a map, got ~0tP", [Other, 10]))}).
