%% @private
%% @doc Raw NIF entry points. Use the `fusex' module: it resolves defaults
%% and documents every function; this module only loads the library.
-module(fusex_nif).

-export([devices/0, shape/1, type/1, device/1, free/1, is_live/1, memory/1, reshape/2,
         nop/0, dirty_nop/0, tensor/5, zeros/4, to_binary/1, copy/3, synchronize/1,
         convert/2, binary_op/3, scale/2, event_new/1, event_record/1,
         event_elapsed_us/2, busy_wait/2, priv_dir/0, to_pointer/3, from_pointer/6,
         copy_into/2]).
-export([optim_init/3, optim_step/5, optim_info/1]).
-export([op/3, op_backward/4, op_run/4, op_check/4, op_list/0]).
-export([ssm_saved_shape/3, ssm_save_every/3]).
-export([xla_register/1]).
-export([model_new/3, model_info/1, model_weights/1, model_params/1, model_init_state/2,
         model_reset_state/2, model_step/3, model_forward/3, model_gradients/5,
         model_train_step/5]).

-on_load(init/0).

-define(NOT_LOADED, erlang:nif_error({not_loaded, ?MODULE})).

%% FUSEX_PRIV_DIR names another directory holding fusex_nif.so (and
%% fusex_cuda.so): how `make test-asan' runs the suites against the NIF it
%% built with AddressSanitizer, beside the normal build.
init() ->
    Priv = case os:getenv("FUSEX_PRIV_DIR") of
               Dir when Dir =/= false, Dir =/= "" -> Dir;
               _ -> priv_dir()
           end,
    erlang:load_nif(filename:join(Priv, "fusex_nif"), Priv).

%% The application's priv directory, also when the beams were loaded from a
%% plain ebin/ that is not inside a directory named after the app.
priv_dir() ->
    case code:priv_dir(fusex) of
        {error, _} ->
            Ebin = filename:dirname(code:which(?MODULE)),
            filename:join(filename:dirname(Ebin), "priv");
        Dir ->
            Dir
    end.

devices() -> ?NOT_LOADED.
shape(_T) -> ?NOT_LOADED.
type(_T) -> ?NOT_LOADED.
device(_T) -> ?NOT_LOADED.
free(_T) -> ?NOT_LOADED.
is_live(_T) -> ?NOT_LOADED.
memory(_Device) -> ?NOT_LOADED.
reshape(_T, _Shape) -> ?NOT_LOADED.
nop() -> ?NOT_LOADED.
dirty_nop() -> ?NOT_LOADED.
tensor(_Data, _Type, _Shape, _Device, _Ipc) -> ?NOT_LOADED.
zeros(_Type, _Shape, _Device, _Ipc) -> ?NOT_LOADED.
to_binary(_T) -> ?NOT_LOADED.
copy(_T, _Device, _Ipc) -> ?NOT_LOADED.
synchronize(_TensorOrDevice) -> ?NOT_LOADED.
convert(_T, _Type) -> ?NOT_LOADED.
binary_op(_Op, _A, _B) -> ?NOT_LOADED.
scale(_T, _Factor) -> ?NOT_LOADED.
event_new(_Device) -> ?NOT_LOADED.
event_record(_Event) -> ?NOT_LOADED.
event_elapsed_us(_Start, _Stop) -> ?NOT_LOADED.
busy_wait(_Device, _Us) -> ?NOT_LOADED.
to_pointer(_T, _Kind, _Sync) -> ?NOT_LOADED.
from_pointer(_Pointer, _Type, _Shape, _Device, _Sync, _Offset) -> ?NOT_LOADED.
copy_into(_Src, _Dst) -> ?NOT_LOADED.
optim_init(_Kind, _Params, _Opts) -> ?NOT_LOADED.
optim_step(_Kind, _State, _Params, _Grads, _Hyper) -> ?NOT_LOADED.
optim_info(_State) -> ?NOT_LOADED.
op(_Name, _Positional, _Opts) -> ?NOT_LOADED.
op_backward(_Name, _Cotangent, _Ctx, _Opts) -> ?NOT_LOADED.
op_run(_Name, _Names, _Tensors, _Attrs) -> ?NOT_LOADED.
op_check(_Name, _Inputs, _Attrs, _Device) -> ?NOT_LOADED.
op_list() -> ?NOT_LOADED.
ssm_saved_shape(_XShape, _BShape, _Type) -> ?NOT_LOADED.
ssm_save_every(_XShape, _BShape, _Type) -> ?NOT_LOADED.
xla_register(_Library) -> ?NOT_LOADED.
model_new(_Device, _Spec, _Weights) -> ?NOT_LOADED.
model_info(_Model) -> ?NOT_LOADED.
model_weights(_Model) -> ?NOT_LOADED.
model_params(_Model) -> ?NOT_LOADED.
model_init_state(_Model, _Batch) -> ?NOT_LOADED.
model_reset_state(_Model, _State) -> ?NOT_LOADED.
model_step(_Model, _State, _Frame) -> ?NOT_LOADED.
model_forward(_Model, _State, _Window) -> ?NOT_LOADED.
model_gradients(_Model, _Inputs, _Targets, _Loss, _Grads) -> ?NOT_LOADED.
model_train_step(_Model, _Optimizer, _Inputs, _Targets, _Opts) -> ?NOT_LOADED.
