/*
 * The C++ door of hwplug::unified_attention and hwplug::unified_attention_with_output:
 * a compiled decode step runs each layer's attention on the native kernel with no Python
 * in between, for calls Python has already checked twice over.
 *
 * A call runs here only when two approvals, both written by Python alone, cover it:
 *
 * - its layer: the dtypes, sizes and strides of every tensor argument, the backend's
 *   name, scale and sliding window. hwplug.attention approves a layer after its
 *   validated op (hwplug::unified_attention_checked, ..._with_output_checked: the ops'
 *   Python kernels) has checked and computed a call of it on the torch backend's
 *   native path: the query taken as it is, the step's rows stored by the kernel's own
 *   call, the result written into the output where it may be;
 * - its step: the torch backend's prepare() issues a ticket for a prepared decode step
 *   (every sequence decodes one token, in the first rows) naming the step object, the
 *   memory and shapes of its four metadata tensors, and its own copy of the int64 block
 *   table and lengths the kernel reads. The ticket is used only while that very step is the
 *   current one of the calling context (hwplug.attention.forward_context: a Python
 *   context variable, read here), so exactly when the Python op would attend from it,
 *   and it is revoked when the step object is freed.
 *
 * Anything else goes to the validated ops, which raise the named errors or compute the
 * call: a layer or step not approved, tensors that share memory (checked here on every
 * call, from their addresses), a cache of other geometry than the step's, a closed door
 * (HWPLUG_NATIVE_KERNELS=0, HWPLUG_NATIVE_DOOR=0) and any status of the kernel, which
 * checks every index it reads (block ids, lengths, slots) itself.
 *
 * Reading the context variable needs Python's C API: without Python's headers this part
 * is built empty and every call goes to the validated ops.
 */
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <memory>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "door.h"

#if defined(__has_include)
#if __has_include(<Python.h>)
#define HWPLUG_ATTENTION_DOOR 1
#include <Python.h>
#endif
#endif

#if defined(HWPLUG_ATTENTION_DOOR)

namespace {

/* hwplug_paged_decode of the C library (csrc/paged_decode.c). */
using DecodeKernel = int (*)(const void *query, int qkind, void *key_cache, void *value_cache,
                             int kind, const float *lut, int64_t block_stride,
                             int64_t pos_stride, int64_t head_stride, const int64_t *table,
                             int64_t table_stride, const int64_t *lens, int64_t n, int kv_heads,
                             int group, int head_size, int block_size, int64_t window,
                             float scale, void *out, int threads, const void *new_keys,
                             const void *new_values, const int64_t *slots, int64_t new_rows,
                             int64_t num_blocks, int64_t table_cols, int64_t *fault);

/* A tensor's part of a layout: dtype, rank, four sizes and four strides (-1 past its
 * rank; all -1 for a tensor not given). */
constexpr int kTensorFields = 10;
/* A layer: query, key, value, output, key_cache, value_cache; the two scales' dtype and
 * rank; the scale's bits; the sliding window (-1: none). */
constexpr int kLayerFields = 6 * kTensorFields + 4 + 2;
/* A step's metadata tensors: query_start_loc, seq_lens, block_table, slot_mapping, each
 * its address, dtype, rank, two sizes and two strides (-1 past its rank). */
constexpr int kMetaFields = 4 * 7;

/* dtype, rank, then `width` sizes and `width` strides (-1 past the rank) */
void describe_shape(int64_t *f, const at::Tensor &t, int64_t width) {
    f[0] = static_cast<int64_t>(t.scalar_type());
    f[1] = t.dim();
    for (int64_t d = 0; d < width; d++) {
        const bool in = d < t.dim();
        f[2 + d] = in ? t.size(d) : -1;
        f[2 + width + d] = in ? t.stride(d) : -1;
    }
}

void describe(int64_t *f, const at::Tensor *t) {
    if (t == nullptr) {
        for (int i = 0; i < kTensorFields; i++) f[i] = -1;
        return;
    }
    describe_shape(f, *t, 4);
}

struct Layer {
    std::array<int64_t, kLayerFields> v;
    std::string backend;
    bool operator==(const Layer &o) const { return v == o.v && backend == o.backend; }
};
struct LayerHash {
    size_t operator()(const Layer &layer) const {
        uint64_t h = 1469598103934665603ull; /* FNV-1a over the fields, then the name */
        for (int64_t f : layer.v) h = (h ^ static_cast<uint64_t>(f)) * 1099511628211ull;
        for (char c : layer.backend) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
        return static_cast<size_t>(h);
    }
};

/* What a ticket names: the step's metadata as the op sees it, and what the kernel reads:
 * its own copies of the block table's rows and the lengths (made when it is issued), and
 * the slots, which are the leading entries of the step's slot_mapping (a call is served
 * only with that very tensor, so they are alive whenever they are read). */
struct Ticket {
    std::array<int64_t, kMetaFields> meta;
    std::vector<int64_t> table_copy, lens_copy;
    int64_t table_cols; /* the copy's columns (rows of it are this far apart) */
    const int64_t *slots;
    int64_t decoding; /* sequences 0..decoding-1 decode one token each, from query rows
                         0..decoding-1, stored at slots[0..decoding-1] */
    int64_t num_tokens;
    int64_t num_blocks, block_size;
};

constexpr size_t kMaxLayers = 4096;  /* layer layouts kept (a model has a handful) */
constexpr size_t kMaxTickets = 256;  /* steps alive at once (an engine has one or two) */
std::mutex lock;
std::unordered_map<Layer, char, LayerHash> layers;
std::unordered_map<int64_t, std::shared_ptr<const Ticket>> tickets;
std::atomic<DecodeKernel> kernel{nullptr}; /* set once, by hwplug_attention_door_bind */
PyObject *current_step = nullptr; /* the context variable of forward_context (a reference) */
int64_t served = 0, handed = 0;

/* Count a call served here (true) or handed to the validated op; returns `here`. */
bool counted(bool here) {
    std::lock_guard<std::mutex> hold(lock);
    (here ? served : handed)++;
    return here;
}

void describe_meta(int64_t *f, const at::Tensor &t) {
    f[0] = reinterpret_cast<int64_t>(t.data_ptr());
    describe_shape(f + 1, t, 2);
}

/* The id of the calling context's current step (0: none), as Python's id() gives it. */
int64_t current_step_id() {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *value = nullptr;
    int64_t id = 0;
    if (PyContextVar_Get(current_step, nullptr, &value) == 0 && value != nullptr) {
        if (value != Py_None) id = reinterpret_cast<int64_t>(value);
        Py_DECREF(value);
    } else {
        PyErr_Clear();
    }
    PyGILState_Release(gil);
    return id;
}

/* The byte span a tensor's elements cover: [first, last). */
struct Span {
    uintptr_t first, last;
};
Span span_of(const at::Tensor &t) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(t.data_ptr());
    int64_t extent = 0;
    for (int64_t d = 0; d < t.dim(); d++) {
        if (t.size(d) > 1) extent += (t.size(d) - 1) * t.stride(d);
    }
    return Span{start, start + static_cast<uintptr_t>((extent + 1) * t.element_size())};
}
Span span_of(const void *data, int64_t bytes) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(data);
    return Span{start, start + static_cast<uintptr_t>(bytes)};
}

/* Whether no written span meets another argument's (the kernel's arguments must not share
 * memory; where two spans merely meet, the validated op decides with its exact test). */
bool apart(const std::array<Span, 7> &spans, int written) {
    for (int i = 0; i < written; i++) {
        for (size_t j = 0; j < spans.size(); j++) {
            if (static_cast<int>(j) == i || spans[j].first == spans[j].last) continue;
            if (spans[i].first < spans[j].last && spans[j].first < spans[i].last) return false;
        }
    }
    return true;
}

/* Whether the block ids the kernel may read (each decoding sequence's columns up to its
 * length) are still the ticket's copy of them: a table changed since prepare() is the
 * validated op's to follow or refuse. The tensor is the ticket's (its address, dtype,
 * sizes and strides compared), its lengths checked against its columns by prepare(). */
template <typename Id>
bool same_ids(const Id *live, int64_t s0, int64_t s1, const Ticket &ticket) {
    for (int64_t b = 0; b < ticket.decoding; b++) {
        int64_t used = (ticket.lens_copy[b] + ticket.block_size - 1) / ticket.block_size;
        if (used > ticket.table_cols) used = ticket.table_cols;
        const int64_t *copy = ticket.table_copy.data() + b * ticket.table_cols;
        for (int64_t c = 0; c < used; c++) {
            if (static_cast<int64_t>(live[b * s0 + c * s1]) != copy[c]) return false;
        }
    }
    return true;
}

bool same_blocks(const at::Tensor &block_table, const Ticket &ticket) {
    if (block_table.size(0) < ticket.decoding || block_table.size(1) < ticket.table_cols) {
        return false;
    }
    const int64_t s0 = block_table.stride(0), s1 = block_table.stride(1);
    switch (block_table.scalar_type()) {
        case c10::ScalarType::Int:
            return same_ids(static_cast<const int32_t *>(block_table.data_ptr()), s0, s1, ticket);
        case c10::ScalarType::Long:
            return same_ids(static_cast<const int64_t *>(block_table.data_ptr()), s0, s1, ticket);
        default:
            return false;
    }
}

using Scale = const at::Tensor &;

void checked_into(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                  const at::Tensor &output, const at::Tensor &key_cache,
                  const at::Tensor &value_cache, const at::Tensor &query_start_loc,
                  const at::Tensor &seq_lens, const at::Tensor &block_table,
                  const at::Tensor &slot_mapping, Scale k_scale, Scale v_scale,
                  c10::string_view backend, double scale, std::optional<int64_t> window) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("hwplug::unified_attention_with_output_checked", "")
                         .typed<void(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                     const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                     const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                     const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                     c10::string_view, double, std::optional<int64_t>)>();
    op.call(query, key, value, output, key_cache, value_cache, query_start_loc, seq_lens,
            block_table, slot_mapping, k_scale, v_scale, backend, scale, window);
}

at::Tensor checked(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                   const at::Tensor &key_cache, const at::Tensor &value_cache,
                   const at::Tensor &query_start_loc, const at::Tensor &seq_lens,
                   const at::Tensor &block_table, const at::Tensor &slot_mapping, Scale k_scale,
                   Scale v_scale, c10::string_view backend, double scale,
                   std::optional<int64_t> window) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("hwplug::unified_attention_checked", "")
                         .typed<at::Tensor(const at::Tensor &, const at::Tensor &,
                                           const at::Tensor &, const at::Tensor &,
                                           const at::Tensor &, const at::Tensor &,
                                           const at::Tensor &, const at::Tensor &,
                                           const at::Tensor &, const at::Tensor &,
                                           const at::Tensor &, c10::string_view, double,
                                           std::optional<int64_t>)>();
    return op.call(query, key, value, key_cache, value_cache, query_start_loc, seq_lens,
                   block_table, slot_mapping, k_scale, v_scale, backend, scale, window);
}

/* Attend from the door into `out` (the query's shape and dtype, contiguous); whether it
 * did (false: the call is the validated op's). */
bool attend(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
            const at::Tensor *output, const at::Tensor &key_cache,
            const at::Tensor &value_cache, const at::Tensor &query_start_loc,
            const at::Tensor &seq_lens, const at::Tensor &block_table,
            const at::Tensor &slot_mapping, Scale k_scale, Scale v_scale,
            c10::string_view backend, double scale, std::optional<int64_t> window,
            at::Tensor *made) {
    using hwplug_door::plain;
    const DecodeKernel run = kernel.load();
    if (run == nullptr || hwplug_door::closed()) return false;
    if (!plain(query, 3) || !plain(key, 3) || !plain(value, 3) || !plain(key_cache, 4) ||
        !plain(value_cache, 4) || !plain(query_start_loc, 1) || !plain(seq_lens, 1) ||
        !plain(block_table, 2) || !plain(slot_mapping, 1) || !plain(k_scale, 0) ||
        !plain(v_scale, 0) || (output != nullptr && !plain(*output, 3))) {
        return false;
    }
    Layer layer{};
    int64_t *f = layer.v.data();
    describe(f, &query);
    describe(f + kTensorFields, &key);
    describe(f + 2 * kTensorFields, &value);
    describe(f + 3 * kTensorFields, output);
    describe(f + 4 * kTensorFields, &key_cache);
    describe(f + 5 * kTensorFields, &value_cache);
    int64_t *rest = f + 6 * kTensorFields;
    rest[0] = static_cast<int64_t>(k_scale.scalar_type());
    rest[1] = k_scale.dim();
    rest[2] = static_cast<int64_t>(v_scale.scalar_type());
    rest[3] = v_scale.dim();
    std::memcpy(&rest[4], &scale, sizeof(double));
    rest[5] = window.has_value() ? *window : -1;
    layer.backend.assign(backend.data(), backend.size());

    const int64_t step = current_step_id();
    std::shared_ptr<const Ticket> held; /* (alive for this call, revoked or not) */
    {
        std::lock_guard<std::mutex> hold(lock);
        if (step == 0 || layers.find(layer) == layers.end()) return false;
        auto it = tickets.find(step);
        if (it == tickets.end()) return false;
        held = it->second;
    }
    const Ticket &ticket = *held;
    std::array<int64_t, kMetaFields> meta{};
    describe_meta(meta.data(), query_start_loc);
    describe_meta(meta.data() + 7, seq_lens);
    describe_meta(meta.data() + 14, block_table);
    describe_meta(meta.data() + 21, slot_mapping);
    if (meta != ticket.meta) return false;
    if (!same_blocks(block_table, ticket)) return false;
    const int64_t n = query.size(0);
    /* (issue() took 1 <= decoding <= num_tokens) */
    if (n != ticket.num_tokens || key_cache.size(0) != ticket.num_blocks ||
        key_cache.size(1) != ticket.block_size) {
        return false;
    }
    at::Tensor out = output != nullptr ? *output : at::empty(query.sizes(), query.options());
    /* written first: the output and the caches (the ticket's own copies of the table and
     * lengths are allocations of their own, apart from every tensor) */
    const std::array<Span, 7> spans{span_of(out),
                                    span_of(key_cache),
                                    span_of(value_cache),
                                    span_of(query),
                                    span_of(key),
                                    span_of(value),
                                    span_of(ticket.slots, ticket.decoding * 8)};
    if (!apart(spans, 3)) return false;

    const int kv_heads = static_cast<int>(key_cache.size(2));
    const int qkind = query.scalar_type() == c10::ScalarType::Float ? 0 : 1;
    const int kind = qkind; /* the approved layer's cache has the query's dtype */
    if (ticket.decoding < n) {
        /* rows past the step's tokens are padding: zero, as the Python op leaves them */
        const int64_t row_bytes = query.size(1) * query.size(2) * out.element_size();
        std::memset(static_cast<char *>(out.data_ptr()) + ticket.decoding * row_bytes, 0,
                    static_cast<size_t>((n - ticket.decoding) * row_bytes));
    }
    int64_t fault[3] = {0, 0, 0};
    const int status = run(
        query.data_ptr(), qkind, key_cache.data_ptr(), value_cache.data_ptr(), kind, nullptr,
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        ticket.table_copy.data(), ticket.table_cols, ticket.lens_copy.data(), ticket.decoding,
        kv_heads,
        static_cast<int>(query.size(1) / kv_heads), static_cast<int>(query.size(2)),
        static_cast<int>(ticket.block_size), window.has_value() ? *window : 0,
        static_cast<float>(scale), out.data_ptr(), at::get_num_threads(), key.data_ptr(),
        value.data_ptr(), ticket.slots, ticket.decoding, key_cache.size(0), ticket.table_cols,
        fault);
    if (status != 0) return false; /* (the kernel wrote nothing: the validated op explains) */
    if (made != nullptr) *made = out;
    return true;
}

at::Tensor unified_attention(const at::Tensor &query, const at::Tensor &key,
                             const at::Tensor &value, const at::Tensor &key_cache,
                             const at::Tensor &value_cache, const at::Tensor &query_start_loc,
                             const at::Tensor &seq_lens, const at::Tensor &block_table,
                             const at::Tensor &slot_mapping, Scale k_scale, Scale v_scale,
                             c10::string_view backend, double scale,
                             std::optional<int64_t> window) {
    at::Tensor out;
    if (counted(attend(query, key, value, nullptr, key_cache, value_cache, query_start_loc,
                       seq_lens, block_table, slot_mapping, k_scale, v_scale, backend, scale,
                       window, &out))) {
        return out;
    }
    return checked(query, key, value, key_cache, value_cache, query_start_loc, seq_lens,
                   block_table, slot_mapping, k_scale, v_scale, backend, scale, window);
}

void unified_attention_with_output(const at::Tensor &query, const at::Tensor &key,
                                   const at::Tensor &value, const at::Tensor &output,
                                   const at::Tensor &key_cache, const at::Tensor &value_cache,
                                   const at::Tensor &query_start_loc,
                                   const at::Tensor &seq_lens, const at::Tensor &block_table,
                                   const at::Tensor &slot_mapping, Scale k_scale, Scale v_scale,
                                   c10::string_view backend, double scale,
                                   std::optional<int64_t> window) {
    if (counted(attend(query, key, value, &output, key_cache, value_cache, query_start_loc,
                       seq_lens, block_table, slot_mapping, k_scale, v_scale, backend, scale,
                       window, nullptr))) {
        return;
    }
    checked_into(query, key, value, output, key_cache, value_cache, query_start_loc, seq_lens,
                 block_table, slot_mapping, k_scale, v_scale, backend, scale, window);
}

}  // namespace

extern "C" {

/* Whether this build has the attention door (1) or was built without Python's headers (0). */
int hwplug_attention_door_available(void) { return 1; }

/* The C library's decode kernel and forward_context's context variable (a new reference is
 * kept: the GIL is taken for it, since ctypes calls here without it); 0 bound, 1 already
 * bound to others. */
int hwplug_attention_door_bind(void *decode, PyObject *variable) {
    /* (the GIL first and alone: a compiled step holds it while its calls take `lock`) */
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_INCREF(variable);
    PyGILState_Release(gil);
    bool kept = false, bound = false;
    {
        std::lock_guard<std::mutex> hold(lock);
        if (kernel.load() == nullptr) {
            current_step = variable;
            kernel.store(reinterpret_cast<DecodeKernel>(decode));
            kept = bound = true;
        } else {
            bound = kernel.load() == reinterpret_cast<DecodeKernel>(decode) && current_step == variable;
        }
    }
    if (!kept) { /* bound before: the reference taken above is not needed */
        gil = PyGILState_Ensure();
        Py_DECREF(variable);
        PyGILState_Release(gil);
    }
    return bound ? 0 : 1;
}

/* Approve a layer Python has checked and computed on the native path. 0 approved; 1 the
 * table is full. */
int hwplug_attention_door_approve(const int64_t *fields, const char *backend) {
    Layer layer{};
    std::memcpy(layer.v.data(), fields, sizeof(int64_t) * kLayerFields);
    layer.backend = backend;
    std::lock_guard<std::mutex> hold(lock);
    if (layers.size() >= kMaxLayers && layers.find(layer) == layers.end()) return 1;
    layers.emplace(std::move(layer), 1);
    return 0;
}

/* Issue the ticket of step `step` (its Python id; revoked when the step is freed). The
 * block table's rows (`decoding` rows of `table_cols`, `table_stride` apart) and the
 * lengths are copied here; `slots` must be the address of the step's slot_mapping (meta's
 * last tensor: int64, contiguous, at least `decoding` entries). 0 issued; 1 the table is
 * full; 2 sizes or slots this door does not take. */
int hwplug_attention_door_issue(int64_t step, const int64_t *meta, const int64_t *table,
                                int64_t table_stride, int64_t table_cols, const int64_t *lens,
                                const int64_t *slots, int64_t decoding, int64_t num_tokens,
                                int64_t num_blocks, int64_t block_size) {
    constexpr int64_t kMaxEntries = int64_t{1} << 24; /* (a step's table: far less) */
    const int64_t *slot_mapping = meta + 21;           /* address, dtype, rank, sizes, strides */
    if (decoding < 1 || table_cols < 1 || table_stride < table_cols ||
        decoding > kMaxEntries / table_cols || num_tokens < decoding ||
        reinterpret_cast<int64_t>(slots) != slot_mapping[0] ||
        slot_mapping[1] != static_cast<int64_t>(c10::ScalarType::Long) || slot_mapping[2] != 1 ||
        slot_mapping[3] != num_tokens || slot_mapping[5] != 1) {
        return 2;
    }
    auto ticket = std::make_shared<Ticket>();
    std::memcpy(ticket->meta.data(), meta, sizeof(int64_t) * kMetaFields);
    ticket->table_copy.resize(static_cast<size_t>(decoding * table_cols));
    for (int64_t b = 0; b < decoding; b++) {
        std::memcpy(ticket->table_copy.data() + b * table_cols, table + b * table_stride,
                    sizeof(int64_t) * static_cast<size_t>(table_cols));
    }
    ticket->lens_copy.assign(lens, lens + decoding);
    ticket->table_cols = table_cols;
    ticket->slots = slots;
    ticket->decoding = decoding;
    ticket->num_tokens = num_tokens;
    ticket->num_blocks = num_blocks;
    ticket->block_size = block_size;
    std::lock_guard<std::mutex> hold(lock);
    if (tickets.size() >= kMaxTickets && tickets.find(step) == tickets.end()) return 1;
    tickets[step] = std::move(ticket);
    return 0;
}

/* Revoke the ticket of step `step` (its object is being freed). */
void hwplug_attention_door_revoke(int64_t step) {
    std::lock_guard<std::mutex> hold(lock);
    tickets.erase(step);
}

/* counts[0..3]: layers approved, tickets alive, calls served here, calls handed to Python. */
void hwplug_attention_door_counts(int64_t *counts) {
    std::lock_guard<std::mutex> hold(lock);
    counts[0] = static_cast<int64_t>(layers.size());
    counts[1] = static_cast<int64_t>(tickets.size());
    counts[2] = served;
    counts[3] = handed;
}

}  // extern "C"

TORCH_LIBRARY_IMPL(hwplug, CPU, m) {
    m.impl("unified_attention", &unified_attention);
    m.impl("unified_attention_with_output", &unified_attention_with_output);
}

#else /* no Python headers: every call takes the ops' Python kernels */

extern "C" {
int hwplug_attention_door_available(void) { return 0; }
}

#endif
