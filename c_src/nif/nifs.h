/* Every NIF the library exports, family by family. A family lists its
 * functions here; c_src/nif/nif.c concatenates the lists into the one table
 * erl_nif needs. */
#ifndef FX_NIFS_H
#define FX_NIFS_H

#include "nif/nif.h"

/* tensor_nif.c */
int fx_event_type_open(ErlNifEnv *env); /* the timing events' resource type */
ERL_NIF_TERM nif_devices(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_shape(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_type(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_device(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_free(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_is_live(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_memory(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_reshape(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_nop(ErlNifEnv *, int, const ERL_NIF_TERM[]);
FX_ENTRY(nif_tensor);
FX_ENTRY(nif_zeros);
FX_ENTRY(nif_to_binary);
FX_ENTRY(nif_copy);
FX_ENTRY(nif_synchronize);
FX_ENTRY(nif_convert);
FX_ENTRY(nif_binary);
FX_ENTRY(nif_scale);
FX_ENTRY(nif_event_new);
FX_ENTRY(nif_event_record);
FX_ENTRY(nif_event_elapsed);
FX_ENTRY(nif_busy_wait);

#define FX_TENSOR_NIFS                                               \
    {"devices", 0, nif_devices, ERL_NIF_DIRTY_JOB_IO_BOUND},         \
    {"shape", 1, nif_shape, 0},                                      \
    {"type", 1, nif_type, 0},                                        \
    {"device", 1, nif_device, 0},                                    \
    {"free", 1, nif_free, 0},                                        \
    {"is_live", 1, nif_is_live, 0},                                  \
    {"memory", 1, nif_memory, 0},                                    \
    {"reshape", 2, nif_reshape, 0},                                  \
    {"nop", 0, nif_nop, 0},                                          \
    {"dirty_nop", 0, nif_nop, ERL_NIF_DIRTY_JOB_IO_BOUND},           \
    {"tensor", 5, nif_tensor_entry, 0},                              \
    {"zeros", 4, nif_zeros_entry, 0},                                \
    {"to_binary", 1, nif_to_binary_entry, 0},                        \
    {"copy", 3, nif_copy_entry, 0},                                  \
    {"synchronize", 1, nif_synchronize_entry, 0},                    \
    {"convert", 2, nif_convert_entry, 0},                            \
    {"binary_op", 3, nif_binary_entry, 0},                           \
    {"scale", 2, nif_scale_entry, 0},                                \
    {"event_new", 1, nif_event_new_entry, 0},                        \
    {"event_record", 1, nif_event_record_entry, 0},                  \
    {"event_elapsed_us", 2, nif_event_elapsed_entry, 0},             \
    {"busy_wait", 2, nif_busy_wait_entry, 0}

/* pointer_nif.c */
FX_ENTRY(nif_to_pointer);
FX_ENTRY(nif_from_pointer);
FX_ENTRY(nif_copy_into);

#define FX_POINTER_NIFS                                              \
    {"to_pointer", 3, nif_to_pointer_entry, 0},                      \
    {"from_pointer", 6, nif_from_pointer_entry, 0},                  \
    {"copy_into", 2, nif_copy_into_entry, 0}

/* optim_nif.c */
FX_ENTRY(nif_optim_init);
FX_ENTRY(nif_optim_step);
FX_ENTRY(nif_optim_info);

#define FX_OPTIM_NIFS                                                \
    {"optim_init", 3, nif_optim_init_entry, 0},                      \
    {"optim_step", 5, nif_optim_step_entry, 0},                      \
    {"optim_info", 1, nif_optim_info_entry, 0}

/* op_nif.c: every described op (c_src/core/op.h), by name */
FX_ENTRY(nif_op);
FX_ENTRY(nif_op_backward);
FX_ENTRY(nif_op_run);
ERL_NIF_TERM nif_op_check(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_op_list(ErlNifEnv *, int, const ERL_NIF_TERM[]);

#define FX_OP_NIFS                                                   \
    {"op", 3, nif_op_entry, 0},                                      \
    {"op_backward", 4, nif_op_backward_entry, 0},                    \
    {"op_run", 4, nif_op_run_entry, 0},                              \
    {"op_check", 4, nif_op_check, 0},                                \
    {"op_list", 0, nif_op_list, 0}

/* ssm_shape_nif.c: the selective scan's saved states from shapes alone */
ERL_NIF_TERM nif_ssm_saved_shape(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_ssm_save_every(ErlNifEnv *, int, const ERL_NIF_TERM[]);

#define FX_SSM_SHAPE_NIFS                                            \
    {"ssm_saved_shape", 3, nif_ssm_saved_shape, 0},                  \
    {"ssm_save_every", 3, nif_ssm_save_every, 0}

/* xla_nif.c: registration of the XLA custom-call targets (docs/XLA.md);
 * dirty IO: it may load a library. */
ERL_NIF_TERM nif_xla_register(ErlNifEnv *, int, const ERL_NIF_TERM[]);

#define FX_XLA_NIFS {"xla_register", 1, nif_xla_register, ERL_NIF_DIRTY_JOB_IO_BOUND}

/* model_nif.c: resident models (docs/MODELS.md) */
FX_ENTRY(nif_model_new);
FX_ENTRY(nif_model_init_state);
FX_ENTRY(nif_model_reset_state);
FX_ENTRY(nif_model_step);
FX_ENTRY(nif_model_forward);
FX_ENTRY(nif_model_gradients);
FX_ENTRY(nif_model_train_step);
ERL_NIF_TERM nif_model_info(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_model_weights(ErlNifEnv *, int, const ERL_NIF_TERM[]);
ERL_NIF_TERM nif_model_params(ErlNifEnv *, int, const ERL_NIF_TERM[]);

#define FX_MODEL_NIFS                                                \
    {"model_new", 3, nif_model_new_entry, 0},                        \
    {"model_info", 1, nif_model_info, 0},                            \
    {"model_weights", 1, nif_model_weights, 0},                      \
    {"model_params", 1, nif_model_params, 0},                        \
    {"model_init_state", 2, nif_model_init_state_entry, 0},          \
    {"model_reset_state", 2, nif_model_reset_state_entry, 0},        \
    {"model_step", 3, nif_model_step_entry, 0},                      \
    {"model_forward", 3, nif_model_forward_entry, 0},                \
    {"model_gradients", 5, nif_model_gradients_entry, 0},            \
    {"model_train_step", 5, nif_model_train_step_entry, 0}

#endif
