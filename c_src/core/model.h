/* Resident models (docs/MODELS.md): a stack of layers built on one device
 * from a spec, its weights owned by the model, answered a frame at a time
 * (model_step), a window at a time (model_forward) and trained
 * (model_gradients + the fused optimizer). Every layer runs on the op
 * layer's `_into` ops (linear.h, norm.h, linrec.h, rnn.h); nothing here
 * knows about Erlang.
 *
 * Layers, x [..., in] -> y [..., out]:
 *   linear      y = act(x w^T + b)            w [out, in], b [out]
 *   rms_norm    y = rms_norm(x) * weight      weight [in]
 *   layer_norm  y = layer_norm(x) * weight + bias
 *   mingru      zl = x w_z^T + b_z, c = x w_h^T + b_h, h = mingru(zl, c)
 *   minlstm     fl, il, c from w_f, w_i, w_h (and biases), h = minlstm(...)
 *   gru, lstm   one PyTorch nn.GRU / nn.LSTM layer: w_ih, w_hh, b_ih, b_hh
 *   mamba       state-spaces/mamba's Mamba module (d_model = in = out):
 *               x_in = x w_in_x^T, z = x w_in_z^T (in_proj's two halves),
 *               u = silu(causal_conv1d(x_in; w_conv, b_conv)),
 *               dt_low, B, C = u w_x_dt^T, u w_x_b^T, u w_x_c^T (x_proj's
 *               three blocks), dt = dt_low w_dt^T (dt_proj, its bias b_dt
 *               the scan's dt_bias, softplus), y = selective_scan(u, dt, a,
 *               B, C, d, z), out = y w_out^T; a is the scan's A
 *               (-exp(A_log) of a PyTorch checkpoint)
 * with `residual`: y = x + layer(x) (in == out). */
#ifndef FX_CORE_MODEL_H
#define FX_CORE_MODEL_H

#include <pthread.h>
#include <stdbool.h>

#include "core/runtime.h"
#include "fusex_loss.h"

typedef enum fx_layer_kind {
    FX_LAYER_LINEAR = 0,
    FX_LAYER_RMS_NORM,
    FX_LAYER_LAYER_NORM,
    FX_LAYER_MINGRU,
    FX_LAYER_MINLSTM,
    FX_LAYER_GRU,
    FX_LAYER_LSTM,
    FX_LAYER_MAMBA,
    FX_LAYER_KIND_COUNT
} fx_layer_kind;

/* The most weight slots a layer has (mamba's twelve). */
#define FX_LAYER_MAX_SLOTS 12
/* The most frame buffers a layer keeps in a state (mamba's eight). */
#define FX_LAYER_MAX_TMP 8
/* The most layers a model has. */
#define FX_MODEL_MAX_LAYERS 64

typedef struct fx_layer_spec {
    int kind;       /* fx_layer_kind */
    int64_t size;   /* linear: out; the recurrent layers: hidden; norms: unused (0) */
    int activation; /* linear: fx_activation */
    bool bias;      /* linear, layer_norm, the recurrent layers: biases exist */
    bool residual;  /* y = x + layer(x) */
    double eps;     /* norms */
    int64_t inner, dstate, dconv, dt_rank; /* mamba: d_inner, d_state, d_conv, dt_rank */
} fx_layer_spec;

typedef struct fx_model_spec {
    fx_dtype dtype; /* f32, or f64 on the CPU */
    int64_t input;  /* the frame's width */
    int nlayers;
    const fx_layer_spec *layers;
    uint64_t seed; /* the initial weights where none are given */
    bool no_graph; /* frames as plain launches, never a CUDA graph (the spec's graph => false) */
} fx_model_spec;

typedef struct fx_layer {
    fx_layer_spec spec;
    int64_t in, out;
    int nslots;
    fx_tensor param[FX_LAYER_MAX_SLOTS]; /* no buffer: an absent bias */
    fx_tensor grad[FX_LAYER_MAX_SLOTS];  /* allocated by the first gradient call */
} fx_layer;

typedef struct fx_model {
    uint64_t id; /* states name the model they were made for */
    fx_device *device;
    fx_dtype dtype;
    int64_t input, output;
    int nlayers;
    fx_layer *layer;
    bool grads_ready;
    /* Frames are captured into a CUDA graph per state and replayed (a CUDA
     * device whose backend has graphs, the spec not saying graph => false,
     * no capture failed yet); else plain launches, frame_why saying why. */
    bool graphs;
    char frame_why[192];
    pthread_mutex_t lock; /* one call at a time: frames, windows and training share the weights */
} fx_model;

/* "linear", "rms_norm", ... (NULL for another value). */
const char *fx_layer_kind_name(int kind);
/* The kind a name spells, or -1. */
int fx_layer_kind_of(const char *name);
/* The weight slots of a kind and their names ("w", "b"; "w_z", "b_z", ...). */
int fx_layer_slot_count(int kind);
const char *fx_layer_slot_name(int kind, int slot);
/* Whether the slot is a bias (absent when spec.bias is false). */
bool fx_layer_slot_is_bias(int kind, int slot);
/* The slot's shape for a layer of `in` inputs; returns its rank. */
int fx_layer_slot_shape(const fx_layer_spec *spec, int64_t in, int slot, int64_t dims[2], const char **layout);

/* Checks the spec (messages name the layer: "layers[2] (gru): hidden:
 * expected an integer >= 1, got 0") and builds the model on `dev`.
 * `weights`, when not NULL, holds nlayers * FX_LAYER_MAX_SLOTS entries
 * (layer-major): each a tensor to copy in (checked: shape, type), NULL
 * for an absent bias; a NULL `weights` initializes them (uniform in
 * +-1/sqrt(fan_in) from spec->seed, norms' weight 1 and bias 0). */
int fx_model_new(fx_device *dev, const fx_model_spec *spec, const fx_tensor *const *weights, fx_model **out,
                 fx_status *st);
void fx_model_free(fx_model *m);

/* The parameters in the optimizer's order (layer by layer, slot by slot,
 * absent biases skipped): their count, and the i-th (borrowed). */
int fx_model_param_count(const fx_model *m);
const fx_tensor *fx_model_param(const fx_model *m, int i);
/* The same order over the gradients of the last fx_model_gradients call
 * (NULL before the first). */
const fx_tensor *fx_model_grad(const fx_model *m, int i);

/* The recurrent state of a batch, and what a frame needs resident: every
 * layer's activations [batch, width], the recurrences' projections and an
 * arena for the ops' scratch, so a frame allocates nothing. */
typedef struct fx_model_state {
    uint64_t model_id;
    int64_t batch;
    int nlayers;
    fx_tensor *rec;   /* [nlayers][2]: h (and c for the LSTM); mamba: the scan's and the conv's
                       * states; no buffer outside recurrent layers */
    fx_tensor *act;   /* [nlayers]: layer l's output frame (the last is unused: step writes `out`) */
    fx_tensor *inner; /* [nlayers]: a residual layer's own output before the sum */
    fx_tensor *proj;  /* [nlayers][FX_LAYER_MAX_TMP]: the min layers' projections, mamba's
                       * intermediates */
    fx_tensor arena;  /* scratch of the frame's ops (u8) */
    /* The frame as a CUDA graph (models with graphs): captured on the
     * state's own stream at its second frame (the first, plain, sets up
     * what the libraries make on first use), replayed from then on. The
     * graph reads the frame from frame_in and writes the output to
     * frame_out, the state's own buffers: each frame is copied in before
     * the launch and out after it. weights_key: the weights' addresses
     * when captured (a graph holds them). */
    fx_device *device;
    void *capture_stream;
    void *graph;
    fx_tensor frame_in, frame_out;
    uint64_t frames, replays, weights_key;
    pthread_mutex_t lock;
} fx_model_state;

/* A state of zeros for `batch` (>= 1) rows. */
int fx_model_state_new(const fx_model *m, int64_t batch, fx_model_state **out, fx_status *st);
void fx_model_state_free(fx_model_state *s);
/* Zeros the recurrences again. */
int fx_model_state_reset(const fx_model *m, fx_model_state *s, fx_status *st);

/* One frame [batch, input] through every layer: the states in place, the
 * model's output into `out` [batch, output] (same type and device). Every
 * op is enqueued on the device's stream in order, or, with graphs, the
 * state's graph is (captured at its second frame; a capture that fails
 * turns the model's graphs off for good, the frame then launched plainly:
 * never an error); nothing is allocated on the device. */
int fx_model_step_into(fx_model *m, fx_model_state *s, const fx_tensor *frame, const fx_tensor *out,
                       fx_status *st);
/* Whether the model's frames are enqueued as graphs; when not, why into
 * `why` (`len` bytes). */
bool fx_model_frame_graphs(fx_model *m, char *why, size_t len);

/* A window [batch, seqlen, input] from the state `s` (updated to the
 * state after the window); y allocated [batch, seqlen, output]. */
int fx_model_forward(fx_model *m, fx_model_state *s, const fx_tensor *window, fx_tensor *y, fx_status *st);

/* The loss of a window from zero states, and every parameter's gradient
 * into the model's resident gradients (fx_model_grad). `loss` is an
 * fx_loss_kind (include/fusex_loss.h). MSE: targets like the output, the
 * mean of (y - t)^2 over every element. Cross-entropy: targets {s,32}
 * [batch, seqlen] class indices in [0, output), the mean over rows of
 * -log softmax(y)[t]. The loss's rows and its gradient dy are computed on
 * the model's device; only the rows' losses come down (one value a row,
 * summed on the host in f64, in order), and cross-entropy's labels, whose
 * range is checked first. With `want_grads` false only the loss. */
int fx_model_gradients(fx_model *m, const fx_tensor *inputs, const fx_tensor *targets, int loss, bool want_grads,
                       double *loss_out, fx_status *st);

#endif
