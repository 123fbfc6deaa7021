// The attention bridge: the one place libtorch autograd and the FLAMIA kernels meet.
//
// A torch::autograd::Function whose forward/backward either call libtorch's varlen flash
// attention (the `bf16` control on CUDA) or hand raw pointers, shapes and the current CUDA stream
// to Rust callbacks (FLAMIA on CUDA; every path on CPU, where Rust runs the reference).
//
// Layouts: q (tokens, heads_q, head_dim), k/v (tokens, heads_kv, head_dim), documents packed back
// to back and delimited by cu_seqlens (int32, [0, ..., tokens]); o like q; lse (heads_q, tokens)
// float32 (natural-log log-sum-exp of the scaled scores, the flash-attention varlen layout).
// Mirrored in trainer/src/attention/ffi.rs: keep the two structs identical.
//
// FLAMIA on CUDA: the forward quantises Q, K, V into a uint8 tensor allocated here per call
// (libtorch's caching allocator; its size comes from Rust) and saves that tensor, not the BF16
// q, k, v, for the backward, which reads the forward's codes and exponents as they are.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#ifdef FLAMIA_WITH_CUDA
// c10/cuda/CUDAStream.h needs the CUDA toolkit's crt/ headers, which the torch wheel does not
// ship. We need two symbols of libc10_cuda only, so they are declared here with the exact layout
// of the real class (one c10::Stream, trivially copyable, returned in registers); the mangled
// names do not depend on the return types.
struct CUstream_st;
namespace c10 {
namespace cuda {
class CUDAStream {
   public:
    CUstream_st* stream() const;

   private:
    c10::Stream stream_;
};
CUDAStream getCurrentCUDAStream(c10::DeviceIndex device_index);
}  // namespace cuda
}  // namespace c10
static_assert(sizeof(c10::cuda::CUDAStream) == 16, "CUDAStream holds one c10::Stream");
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern "C" {

// Options of one call (set by Rust, stored in the autograd context for the backward).
struct FlamiaParams {
    int32_t path;  // 0 exact / bf16 control, 1 mxfp8, 2 nvfp4, 3 leaky-fp8
    uint8_t per_token_scales;
    uint8_t row_ds_exponents;
    uint8_t causal_dq_scaling;
    uint8_t hadamard;
    uint8_t causal;
    uint8_t pad[3];
    float softmax_scale;
    int64_t max_seqlen;
};

// One forward or backward call handed to Rust. Pointers are host pointers on CPU (float32) and
// device pointers on CUDA (bfloat16 for q/k/v/o/do/dq/dk/dv, float32 lse).
struct FlamiaCall {
    FlamiaParams params;
    int64_t tokens;
    int64_t heads_q;
    int64_t heads_kv;
    int64_t head_dim;
    int64_t n_docs;
    const int32_t* cu_seqlens_host;  // n_docs + 1 entries, always on the host
    const int32_t* cu_seqlens_dev;   // the same on the device (CUDA) or the host (CPU)
    int32_t device;                  // -1 for CPU, else the CUDA ordinal
    int32_t is_backward;
    void* stream;                    // cudaStream_t of the current stream (null on CPU)
    const void* q;
    const void* k;
    const void* v;
    void* o;    // written by forward, read by backward
    void* lse;  // written by forward, read by backward
    const void* d_o;
    void* dq;
    void* dk;
    void* dv;
    // FLAMIA on CUDA: the call's quantised Q, K, V (written by forward, read by backward), a
    // device buffer of saved_bytes bytes; null and 0 otherwise.
    void* saved;
    int64_t saved_bytes;
};

// Returns 0 on success; otherwise writes a NUL-terminated message into err.
typedef int32_t (*flamia_callback)(const FlamiaCall* call, char* err, size_t err_len);
// Writes the bytes of the call's quantised-operand buffer into *bytes; 0 on success, as above.
typedef int32_t (*flamia_sizer)(const FlamiaCall* call, int64_t* bytes, char* err, size_t err_len);

}  // extern "C"

namespace {

flamia_callback g_forward = nullptr;
flamia_callback g_backward = nullptr;
flamia_sizer g_saved_bytes = nullptr;
// Called with begin = 1 before and 0 after each attention forward/backward (any path); Rust
// times the span (synchronising the stream first when profiling is on).
typedef void (*flamia_timer)(const FlamiaCall* call, int32_t begin);
flamia_timer g_timer = nullptr;

struct TimerSpan {
    const FlamiaCall* c;
    explicit TimerSpan(const FlamiaCall* call) : c(call) {
        if (g_timer) g_timer(c, 1);
    }
    ~TimerSpan() {
        if (g_timer) g_timer(c, 0);
    }
};

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Exact checksums of a tensor's bits: (sum, index-weighted sum) of its elements read as
// integers of the element size, summed in int64 on the tensor's device (integer sums wrap and are
// exact, so the pair does not depend on the reduction order). Synchronises with the device.
void bits_checksum(const at::Tensor& t, int64_t out[2]) {
    at::Tensor c = t.detach().contiguous().reshape({-1});
    at::Tensor bits;
    switch (c.element_size()) {
        case 1: bits = c.view(at::kChar); break;
        case 2: bits = c.view(at::kShort); break;
        case 4: bits = c.view(at::kInt); break;
        default: bits = c.view(at::kLong); break;
    }
    at::Tensor wide = bits.to(at::kLong);
    at::Tensor weight = at::arange(wide.numel(), wide.options()).remainder(65521).add(1);
    out[0] = wide.sum().item<int64_t>();
    out[1] = wide.mul(weight).sum().item<int64_t>();
}

// `FLAMIA_TRACE_CHECKSUMS=<file>`: every attention forward and backward appends one line with
// the checksums of its inputs and outputs (reproducibility diagnosis; synchronises every call).
struct Trace {
    std::mutex mu;
    FILE* f = nullptr;
    int64_t seq = 0;
};

Trace* trace() {
    static Trace* t = [] {
        const char* path = std::getenv("FLAMIA_TRACE_CHECKSUMS");
        if (path == nullptr || path[0] == '\0') return static_cast<Trace*>(nullptr);
        Trace* tr = new Trace();
        tr->f = std::fopen(path, "a");
        if (tr->f == nullptr) {
            std::fprintf(stderr, "flamia: cannot open FLAMIA_TRACE_CHECKSUMS=%s; no trace\n", path);
            delete tr;
            return static_cast<Trace*>(nullptr);
        }
        return tr;
    }();
    return t;
}

void trace_call(const char* what, int32_t path, std::initializer_list<std::pair<const char*, at::Tensor>> ts) {
    Trace* tr = trace();
    if (tr == nullptr) return;
    std::string line;
    for (const auto& nt : ts) {
        int64_t c[2];
        bits_checksum(nt.second, c);
        char buf[96];
        std::snprintf(buf, sizeof(buf), " %s=%016llx:%016llx", nt.first, static_cast<unsigned long long>(c[0]),
                      static_cast<unsigned long long>(c[1]));
        line += buf;
    }
    std::lock_guard<std::mutex> g(tr->mu);
    std::fprintf(tr->f, "attn %lld %s path=%d%s\n", static_cast<long long>(tr->seq++), what, path, line.c_str());
    std::fflush(tr->f);
}

FlamiaParams params_from_ctx(AutogradContext* ctx) {
    FlamiaParams p{};
    p.path = static_cast<int32_t>(ctx->saved_data["path"].toInt());
    p.per_token_scales = static_cast<uint8_t>(ctx->saved_data["pts"].toInt());
    p.row_ds_exponents = static_cast<uint8_t>(ctx->saved_data["rds"].toInt());
    p.causal_dq_scaling = static_cast<uint8_t>(ctx->saved_data["cdq"].toInt());
    p.hadamard = static_cast<uint8_t>(ctx->saved_data["had"].toInt());
    p.causal = static_cast<uint8_t>(ctx->saved_data["causal"].toInt());
    p.softmax_scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    p.max_seqlen = ctx->saved_data["max_seqlen"].toInt();
    return p;
}

void save_params(AutogradContext* ctx, const FlamiaParams& p) {
    ctx->saved_data["path"] = static_cast<int64_t>(p.path);
    ctx->saved_data["pts"] = static_cast<int64_t>(p.per_token_scales);
    ctx->saved_data["rds"] = static_cast<int64_t>(p.row_ds_exponents);
    ctx->saved_data["cdq"] = static_cast<int64_t>(p.causal_dq_scaling);
    ctx->saved_data["had"] = static_cast<int64_t>(p.hadamard);
    ctx->saved_data["causal"] = static_cast<int64_t>(p.causal);
    ctx->saved_data["scale"] = static_cast<double>(p.softmax_scale);
    ctx->saved_data["max_seqlen"] = p.max_seqlen;
}

// A call on q-shaped tensors (q, o, dq) with heads_kv key/value heads.
FlamiaCall base_call(const FlamiaParams& p, const at::Tensor& q, int64_t heads_kv, const at::Tensor& cu_host,
                     const at::Tensor& cu_dev) {
    FlamiaCall c{};
    c.params = p;
    c.tokens = q.size(0);
    c.heads_q = q.size(1);
    c.heads_kv = heads_kv;
    c.head_dim = q.size(2);
    c.n_docs = cu_host.numel() - 1;
    c.cu_seqlens_host = cu_host.data_ptr<int32_t>();
    c.cu_seqlens_dev = cu_dev.data_ptr<int32_t>();
    c.device = q.is_cuda() ? static_cast<int32_t>(q.get_device()) : -1;
    c.stream = nullptr;
#ifdef FLAMIA_WITH_CUDA
    if (q.is_cuda()) {
        c.stream = static_cast<void*>(c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
    }
#endif
    return c;
}

void call_rust(flamia_callback cb, const FlamiaCall& c, const char* what) {
    if (cb == nullptr) {
        throw std::runtime_error(std::string("flamia bridge: Rust ") + what + " callback not registered");
    }
    char err[2048];
    err[0] = '\0';
    if (cb(&c, err, sizeof(err)) != 0) {
        throw std::runtime_error(std::string("flamia attention ") + what + ": " + err);
    }
}

bool use_libtorch_flash(const at::Tensor& q, const FlamiaParams& p) { return q.is_cuda() && p.path == 0; }

// The uint8 device tensor the forward quantises Q, K, V into (size from Rust), set in c.
at::Tensor alloc_saved(FlamiaCall& c, const at::Tensor& q) {
    if (g_saved_bytes == nullptr) throw std::runtime_error("flamia bridge: Rust sizing callback not registered");
    char err[2048];
    err[0] = '\0';
    int64_t bytes = 0;
    if (g_saved_bytes(&c, &bytes, err, sizeof(err)) != 0) {
        throw std::runtime_error(std::string("flamia attention forward: ") + err);
    }
    at::Tensor saved = at::empty({bytes}, q.options().dtype(at::kByte));
    c.saved = saved.data_ptr();
    c.saved_bytes = bytes;
    return saved;
}

class FlamiaAttention : public torch::autograd::Function<FlamiaAttention> {
   public:
    static at::Tensor forward(AutogradContext* ctx, at::Tensor q, at::Tensor k, at::Tensor v,
                              at::Tensor cu_host, at::Tensor cu_dev, FlamiaParams p) {
        save_params(ctx, p);
        if (use_libtorch_flash(q, p)) {
            FlamiaCall tc = base_call(p, q, k.size(1), cu_host, cu_dev);
            TimerSpan span(&tc);
            auto res = at::_flash_attention_forward(q, k, v, cu_dev, cu_dev, p.max_seqlen, p.max_seqlen, 0.0,
                                                    p.causal != 0, false, static_cast<double>(p.softmax_scale));
            at::Tensor o = std::get<0>(res);
            ctx->save_for_backward({q, k, v, o, std::get<1>(res), cu_host, cu_dev, std::get<2>(res),
                                    std::get<3>(res)});
            trace_call("fwd", p.path, {{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", std::get<1>(res)}});
            return o;
        }
        // Rust path: float32 contiguous on CPU, bfloat16 contiguous on CUDA.
        const auto kind = q.is_cuda() ? at::kBFloat16 : at::kFloat;
        at::Tensor qc = q.to(kind).contiguous();
        at::Tensor kc = k.to(kind).contiguous();
        at::Tensor vc = v.to(kind).contiguous();
        at::Tensor o = at::empty_like(qc);
        at::Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
        FlamiaCall c = base_call(p, qc, kc.size(1), cu_host, cu_dev);
        c.q = qc.data_ptr();
        c.k = kc.data_ptr();
        c.v = vc.data_ptr();
        c.o = o.data_ptr();
        c.lse = lse.data_ptr();
        at::Tensor codes;
        {
            TimerSpan span(&c);
            if (q.is_cuda()) codes = alloc_saved(c, q);
            call_rust(g_forward, c, "forward");
        }
        ctx->saved_data["heads_kv"] = kc.size(1);
        if (q.is_cuda()) {
            // the backward reads the forward's codes: q, k, v themselves are not kept
            ctx->save_for_backward({o, lse, cu_host, cu_dev, codes});
        } else {
            ctx->save_for_backward({o, lse, cu_host, cu_dev, qc, kc, vc});
        }
        trace_call("fwd", p.path, {{"q", qc}, {"k", kc}, {"v", vc}, {"o", o}, {"lse", lse}});
        return o.to(q.scalar_type());
    }

    static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
        const FlamiaParams p = params_from_ctx(ctx);
        auto saved = ctx->get_saved_variables();
        at::Tensor dq, dk, dv, go;
        if (use_libtorch_flash(saved[0], p)) {  // saved: q, k, v, o, lse, cu_host, cu_dev, rng state
            at::Tensor q = saved[0], k = saved[1], v = saved[2], o = saved[3], lse = saved[4];
            at::Tensor cu_host = saved[5], cu_dev = saved[6];
            go = grads[0].to(q.scalar_type()).contiguous();
            FlamiaCall tc = base_call(p, q, k.size(1), cu_host, cu_dev);
            tc.is_backward = 1;
            TimerSpan span(&tc);
            auto res = at::_flash_attention_backward(go, q, k, v, o, lse, cu_dev, cu_dev, p.max_seqlen,
                                                     p.max_seqlen, 0.0, p.causal != 0, saved[7], saved[8],
                                                     static_cast<double>(p.softmax_scale));
            dq = std::get<0>(res);
            dk = std::get<1>(res);
            dv = std::get<2>(res);
        } else {
            // saved: o, lse, cu_host, cu_dev, then the codes (CUDA) or q, k, v (CPU)
            at::Tensor o = saved[0], lse = saved[1], cu_host = saved[2], cu_dev = saved[3];
            const int64_t heads_kv = ctx->saved_data["heads_kv"].toInt();
            go = grads[0].to(o.scalar_type()).contiguous();
            dq = at::empty_like(o);
            dk = at::empty({o.size(0), heads_kv, o.size(2)}, o.options());
            dv = at::empty_like(dk);
            FlamiaCall c = base_call(p, o, heads_kv, cu_host, cu_dev);
            c.is_backward = 1;
            if (o.is_cuda()) {
                c.saved = saved[4].data_ptr();
                c.saved_bytes = saved[4].numel();
            } else {
                c.q = saved[4].data_ptr();
                c.k = saved[5].data_ptr();
                c.v = saved[6].data_ptr();
            }
            c.o = o.data_ptr();
            c.lse = lse.data_ptr();
            c.d_o = go.data_ptr();
            c.dq = dq.data_ptr();
            c.dk = dk.data_ptr();
            c.dv = dv.data_ptr();
            TimerSpan span(&c);
            call_rust(g_backward, c, "backward");
        }
        trace_call("bwd", p.path, {{"do", go}, {"dq", dq}, {"dk", dk}, {"dv", dv}});
        // Gradients in the dtype of the inputs as given to forward (autograd checks this).
        return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

// Gradient hooks (data parallelism, trainer/src/overlap.rs): called by the autograd engine right
// after it accumulated a gradient into a leaf tensor's .grad, on the thread running the backward
// (the caller's on CPU, libtorch's device thread on CUDA), with the current stream of that
// moment (where the accumulation was enqueued; null on CPU and for the legacy default stream).
typedef void (*flamia_grad_ready)(void* ctx, int64_t index, void* stream);
// Called once when the hook is destroyed (the tensor died or the hook was replaced).
typedef void (*flamia_release)(void* ctx);

struct GradReadyHook : public torch::autograd::PostAccumulateGradHook {
    flamia_grad_ready ready;
    flamia_release release;
    void* ctx;
    int64_t index;
    GradReadyHook(flamia_grad_ready r, flamia_release rel, void* c, int64_t i)
        : ready(r), release(rel), ctx(c), index(i) {}
    ~GradReadyHook() override {
        if (release) release(ctx);
    }
    void operator()(const torch::autograd::Variable& tensor) override {
        void* stream = nullptr;
#ifdef FLAMIA_WITH_CUDA
        if (tensor.is_cuda()) {
            stream = static_cast<void*>(c10::cuda::getCurrentCUDAStream(tensor.get_device()).stream());
        }
#endif
        ready(ctx, index, stream);
    }
};

void write_err(char* err, size_t err_len, const char* msg) {
    if (err_len == 0) return;
    std::strncpy(err, msg, err_len - 1);
    err[err_len - 1] = '\0';
}

// Fused AdamW (flamia_bridge_fused_adamw): every view handed to at::_fused_adamw_ is a whole
// number of kAdamBlock elements long. The op's CPU kernel computes the vector body and the scalar
// tail of each tensor with different rounding (measured: v differs in the last bit), so a view's
// tail would give an element other bits than the same element inside a longer view, and ZeRO-1
// (whose shard ends cut the views) would no longer match plain data parallelism bit for bit.
// 64 f32 is a multiple of every vector width (8 for AVX2, 16 for AVX-512).
constexpr int64_t kAdamBlock = 64;

struct AdamGroup {
    std::vector<at::Tensor> p, g, m, v;
    // (destination, padded source): the partial block's results copied back after the update.
    std::vector<std::pair<at::Tensor, at::Tensor>> back;
};

// Adds [start, end) of the flat buffers to grp: views of at most `slice` (a multiple of
// kAdamBlock) elements, and the last (end - start) % kAdamBlock elements through zero-padded
// kAdamBlock-element copies (zero moments and gradient: a finite, discarded update of the pad).
// m and v hold the range starting at moff.
void adam_group_add(AdamGroup& grp, const at::Tensor& p, const at::Tensor& g, const at::Tensor& m,
                    const at::Tensor& v, int64_t start, int64_t end, int64_t moff, int64_t slice) {
    const int64_t bulk_end = start + (end - start) / kAdamBlock * kAdamBlock;
    for (int64_t s = start; s < bulk_end; s += slice) {
        const int64_t n = std::min(slice, bulk_end - s);
        grp.p.push_back(p.narrow(0, s, n));
        grp.g.push_back(g.narrow(0, s, n));
        grp.m.push_back(m.narrow(0, s - moff, n));
        grp.v.push_back(v.narrow(0, s - moff, n));
    }
    const int64_t n = end - bulk_end;
    if (n == 0) return;
    auto padded = [&](const at::Tensor& src, int64_t off) {
        at::Tensor t = at::zeros({kAdamBlock}, src.options());
        t.narrow(0, 0, n).copy_(src.narrow(0, off, n));
        return t;
    };
    grp.p.push_back(padded(p, bulk_end));
    grp.g.push_back(padded(g, bulk_end));
    grp.m.push_back(padded(m, bulk_end - moff));
    grp.v.push_back(padded(v, bulk_end - moff));
    grp.back.emplace_back(p.narrow(0, bulk_end, n), grp.p.back().narrow(0, 0, n));
    grp.back.emplace_back(m.narrow(0, bulk_end - moff, n), grp.m.back().narrow(0, 0, n));
    grp.back.emplace_back(v.narrow(0, bulk_end - moff, n), grp.v.back().narrow(0, 0, n));
}

void adam_group_run(AdamGroup& grp, const at::Tensor& step, double lr, double beta1, double beta2,
                    double weight_decay, double eps) {
    if (grp.p.empty()) return;
    const std::vector<at::Tensor> steps(grp.p.size(), step);
    at::_fused_adamw_(grp.p, grp.g, grp.m, grp.v, {}, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    for (auto& [dst, src] : grp.back) dst.copy_(src);
}

}  // namespace

extern "C" {

void flamia_bridge_register(flamia_callback forward, flamia_callback backward, flamia_sizer saved_bytes,
                            flamia_timer timer) {
    g_forward = forward;
    g_backward = backward;
    g_saved_bytes = saved_bytes;
    g_timer = timer;
}

// Applies the attention Function; on success *out is a new at::Tensor* owned by the caller.
int32_t flamia_bridge_attention(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                                const at::Tensor* cu_host, const at::Tensor* cu_dev, const FlamiaParams* p,
                                at::Tensor** out, char* err, size_t err_len) {
    try {
        at::Tensor o = FlamiaAttention::apply(*q, *k, *v, *cu_host, *cu_dev, *p);
        *out = new at::Tensor(std::move(o));
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// libtorch's deterministic mode (run.deterministic): deterministic algorithms everywhere they
// exist (the flash-attention backward among them), an error from any operation that has none,
// cuDNN deterministic and not benchmarking; `fill` keeps libtorch's NaN fill of every
// uninitialised at::empty in the mode (run.fill_uninitialized_memory), 0 turns it off.
// CUBLAS_WORKSPACE_CONFIG must be set before cuBLAS starts (the Rust side does that). 0 on
// success, else a message in err.
int32_t flamia_bridge_set_deterministic(int32_t on, int32_t fill, char* err, size_t err_len) {
    try {
        auto& ctx = at::globalContext();
        ctx.setDeterministicAlgorithms(on != 0, false);
        ctx.setDeterministicFillUninitializedMemory(fill != 0);
        ctx.setDeterministicCuDNN(on != 0);
        if (on != 0) ctx.setBenchmarkCuDNN(false);
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// 1 when libtorch's deterministic algorithms are on (and not warn-only).
int32_t flamia_bridge_deterministic() {
    const auto& ctx = at::globalContext();
    return ctx.deterministicAlgorithms() && !ctx.deterministicAlgorithmsWarnOnly() ? 1 : 0;
}

// 1 when libtorch fills uninitialised memory with NaN in deterministic mode.
int32_t flamia_bridge_fill_uninitialized() {
    return at::globalContext().deterministicFillUninitializedMemory() ? 1 : 0;
}

// Frees the storage of q, k and v (their sizes and autograd metadata stay) where the attention
// call made from them with path code `path` does not keep them for its backward: on CUDA every
// FLAMIA path saves its own FP8 codes, so leaf q, k, v that only feed attention (selective
// activation checkpointing keeps them until the backward as gradient receivers) need not hold
// their values meanwhile. Exact attention on CUDA (libtorch's flash kernel saves q, k, v) and
// every CPU path (its saved copies may be q, k, v themselves) free nothing. Each storage is freed
// once; the allocation returns to the caching allocator in stream order, after the forward's
// kernels that read it (they run on the current stream). *released gets the bytes freed.
// 0 on success.
int32_t flamia_bridge_release_unsaved_inputs(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                                             int32_t path, int64_t* released, char* err, size_t err_len) {
    try {
        *released = 0;
        FlamiaParams p{};
        p.path = path;
        if (!q->is_cuda() || use_libtorch_flash(*q, p)) return 0;
        std::vector<const c10::StorageImpl*> seen;
        for (const at::Tensor* t : {q, k, v}) {
            if (!t->has_storage()) continue;
            c10::StorageImpl* s = t->storage().unsafeGetStorageImpl();
            if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
            seen.push_back(s);
            *released += static_cast<int64_t>(s->nbytes());
            s->set_data_ptr_noswap(c10::DataPtr(nullptr, t->device()));
            s->set_nbytes(0);
        }
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// The checksums `FLAMIA_TRACE_CHECKSUMS` writes, of one tensor: 0 on success.
int32_t flamia_bridge_checksum(const at::Tensor* t, int64_t* out, char* err, size_t err_len) {
    try {
        bits_checksum(*t, out);
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// Sets the post-accumulate-grad hook of the leaf tensor t (one per tensor: a second call replaces
// the first, whose release runs): after every accumulation into t.grad the autograd engine calls
// ready(ctx, index, stream). release(ctx) runs when the hook is dropped. 0 on success.
int32_t flamia_bridge_grad_hook(const at::Tensor* t, flamia_grad_ready ready, flamia_release release, void* ctx,
                                int64_t index, char* err, size_t err_len) {
    try {
        if (!t->is_leaf() || !t->requires_grad()) {
            if (release) release(ctx);
            write_err(err, err_len, "gradient hooks need a leaf tensor that requires grad");
            return 1;
        }
        torch::autograd::impl::set_post_acc_grad_hooks(*t, std::make_unique<GradReadyHook>(ready, release, ctx, index));
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// One AdamW update (at::_fused_adamw_: one pass reading p, g, m, v and writing p, m, v) of
// [begin, end) of the flat f32 buffers params and grads; exp_avg and exp_avg_sq hold [begin, end)
// from their index 0 (ZeRO-1: the shard; else begin = 0). Elements before decay_end get
// `weight_decay`, the rest none. `step` is a 0-dim f32 tensor on the buffers' device holding t,
// the number of updates including this one (the op reads it on the device for the bias
// corrections 1 - beta^t and does not change it: PyTorch's own `_fused_adamw` increments its step
// tensors before the call, which is what the caller does). `slice` (a positive multiple of 64)
// bounds each view. 0 on success, else a message in err.
int32_t flamia_bridge_fused_adamw(const at::Tensor* params, const at::Tensor* grads, const at::Tensor* exp_avg,
                                  const at::Tensor* exp_avg_sq, const at::Tensor* step, int64_t begin,
                                  int64_t decay_end, int64_t end, int64_t slice, double lr, double beta1,
                                  double beta2, double weight_decay, double eps, char* err, size_t err_len) {
    try {
        TORCH_CHECK(slice > 0 && slice % kAdamBlock == 0, "fused AdamW: slice ", slice, " is not a positive multiple of ",
                    kAdamBlock);
        TORCH_CHECK(0 <= begin && begin <= end && end <= params->numel() && end <= grads->numel(),
                    "fused AdamW: range [", begin, ", ", end, ") of ", params->numel(), " parameters");
        TORCH_CHECK(exp_avg->numel() == end - begin && exp_avg_sq->numel() == end - begin,
                    "fused AdamW: moments of ", exp_avg->numel(), " and ", exp_avg_sq->numel(),
                    " elements for a range of ", end - begin);
        at::NoGradGuard no_grad;
        const int64_t split = std::clamp(decay_end, begin, end);
        AdamGroup decayed, plain;
        adam_group_add(decayed, *params, *grads, *exp_avg, *exp_avg_sq, begin, split, begin, slice);
        adam_group_add(plain, *params, *grads, *exp_avg, *exp_avg_sq, split, end, begin, slice);
        adam_group_run(decayed, *step, lr, beta1, beta2, weight_decay, eps);
        adam_group_run(plain, *step, lr, beta1, beta2, 0.0, eps);
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// A pinned (page-locked) host copy of the CPU tensor t, from libtorch's caching host allocator;
// on success *out is a new at::Tensor* owned by the caller. `Tensor::pin_memory()` without a
// device: libtorch 2.11 deprecates the device argument and prints a warning on every call that
// passes one, which tch's `pin_memory(device)` always does (six lines a training step). 0 on
// success, else a message in err.
int32_t flamia_bridge_pin_memory(const at::Tensor* t, at::Tensor** out, char* err, size_t err_len) {
    try {
        TORCH_CHECK(t->device().is_cpu(), "pin_memory: the tensor is on ", t->device(), ", not the CPU");
        *out = new at::Tensor(t->pin_memory());
        return 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return 1;
    }
}

// Whether t's memory is pinned (`Tensor::is_pinned()` without the deprecated device argument):
// 1 pinned, 0 not, -1 on error (message in err).
int32_t flamia_bridge_is_pinned(const at::Tensor* t, char* err, size_t err_len) {
    try {
        return t->is_pinned() ? 1 : 0;
    } catch (const std::exception& e) {
        write_err(err, err_len, e.what());
        return -1;
    }
}

// 1 when this build can see CUDA streams (compiled with the CUDA headers).
int32_t flamia_bridge_has_cuda() {
#ifdef FLAMIA_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}

}  // extern "C"
