// The CUDA backend against the CPU backend: every MSCCL-EF XML of tests/data (the third-party reference
// algorithms among them) and of $MLOPT_CUDA_XML_DIR (XMLs the collective planner wrote, see
// bench/runtime_cuda.py) runs on both with the same inputs, in every dtype, with whole chunks and with slices,
// bounded FIFOs, in and out of place; every byte of every rank's buffers must be equal (both backends
// reduce in the same order with the same encoders, so even float sums agree bit for bit). Then the GPU's own
// error paths: deadlocks and mismatched messages reported like the CPU's, host pointers refused.
//
// Built only with -DMLOPT_CUDA=ON; exits 77 (ctest: skipped) where no GPU can run it.
//
// `test_cuda_backend bench FILE BYTES [CHUNK_BYTES] [BLOCK_THREADS] [ITERATIONS]` instead times FILE on the GPU
// with BYTES per rank (nccl-tests' size: the larger buffer) and prints one JSON line, with cudaMemcpy's
// device-to-device bandwidth on the same bytes as the physical reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "cuda_backend.hpp"
#include "handles.hpp"
#include "mlopt/mlopt.h"
#include "mlopt/mlopt.hpp"
#include "msccl_xml.hpp"  // internal: a plan from XML without validate_program
#include "program.hpp"
#include "reduce.hpp"
#include "xml.hpp"

namespace {

namespace fs = std::filesystem;

std::string data_dir() {
    const char* repo = std::getenv("MLOPT_REPO");
    return repo ? std::string(repo) + "/runtime/tests/data" : std::string("data");
}

std::vector<std::string> xml_files() {
    std::vector<std::string> files;
    std::vector<std::string> dirs = {data_dir()};
    if (const char* extra = std::getenv("MLOPT_CUDA_XML_DIR")) dirs.push_back(extra);
    for (const std::string& dir : dirs) {
        if (!fs::is_directory(dir)) continue;
        for (const auto& entry : fs::directory_iterator(dir)) {
            if (entry.path().extension() == ".xml") files.push_back(entry.path().string());
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

bool cuda_ok(cudaError_t error, const char* what) {
    if (error == cudaSuccess) return true;
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    return false;
}

// ------------------------------------------------------------------------------------------------ data

// Random elements of `dtype`, mostly ordinary values with a few specials (subnormals, signed zeros, values that
// overflow when summed) but no NaN: NaN payloads legitimately differ between x86 and the GPU.
void fill(std::vector<unsigned char>& bytes, mlopt_dtype dtype, mlopt_redop op, std::mt19937_64& rng) {
    const size_t es = mlopt::dtype_size(dtype);
    const size_t n = bytes.size() / es;
    std::uniform_real_distribution<float> value(op == MLOPT_PROD ? 0.5f : -4.0f, op == MLOPT_PROD ? 1.5f : 4.0f);
    std::uniform_int_distribution<int> special(0, 63);
    for (size_t i = 0; i < n; ++i) {
        const int s = special(rng);
        float f = value(rng);
        if (s == 0) f = 1e-40f;       // float32 subnormal
        if (s == 1) f = -0.0f;
        if (s == 2) f = 3e38f;        // float32 near the top
        if (s == 3) f = 65000.0f;     // float16 near the top
        if (s == 4) f = 3e-7f;        // float16 subnormal
        unsigned char* at = bytes.data() + i * es;
        switch (dtype) {
            case MLOPT_FLOAT32: std::memcpy(at, &f, 4); break;
            case MLOPT_FLOAT16: {
                const uint16_t h = mlopt::float_to_half(f);
                std::memcpy(at, &h, 2);
                break;
            }
            case MLOPT_BFLOAT16: {
                const uint16_t b = mlopt::float_to_bfloat16(f);
                std::memcpy(at, &b, 2);
                break;
            }
            case MLOPT_INT32: {
                const auto v = static_cast<int32_t>(rng());
                std::memcpy(at, &v, 4);
                break;
            }
        }
    }
}

// One rank's memory: out of place an input and an output buffer, in place one buffer holding both.
struct RankBytes {
    std::vector<unsigned char> a;  // input (out of place) or the one buffer (in place)
    std::vector<unsigned char> b;  // output (out of place)
    size_t input_at = 0;           // in place: where the input / output windows start in `a`
    size_t output_at = 0;
};

struct Setup {
    std::vector<RankBytes> ranks;
    size_t count = 0;  // input elements per rank
};

Setup make_setup(const mlopt_program_info& info, const std::string& coll, size_t chunk_elems, mlopt_dtype dtype,
                 mlopt_redop op, bool in_place, uint64_t seed) {
    const size_t chunk_bytes = chunk_elems * mlopt::dtype_size(dtype);
    const auto ic = static_cast<size_t>(info.i_chunks);
    const auto oc = static_cast<size_t>(info.o_chunks);
    Setup s;
    s.count = chunk_elems * ic;
    std::mt19937_64 rng(seed);
    for (int32_t r = 0; r < info.ngpus; ++r) {
        RankBytes rb;
        if (in_place) {
            rb.a.resize(std::max(ic, oc) * chunk_bytes);
            if (coll == "allgather") rb.input_at = static_cast<size_t>(r) * ic * chunk_bytes;
            if (coll == "reducescatter") rb.output_at = static_cast<size_t>(r) * oc * chunk_bytes;
        } else {
            rb.a.resize(ic * chunk_bytes);
            rb.b.resize(oc * chunk_bytes);
            fill(rb.b, dtype, op, rng);  // what a step does not write must stay as it was
        }
        fill(rb.a, dtype, op, rng);
        s.ranks.push_back(std::move(rb));
    }
    return s;
}

struct Pointers {
    std::vector<void*> inputs;
    std::vector<void*> outputs;
};

Pointers host_pointers(Setup& s, bool in_place) {
    Pointers p;
    for (RankBytes& rb : s.ranks) {
        p.inputs.push_back(rb.a.data() + rb.input_at);
        p.outputs.push_back(in_place ? rb.a.data() + rb.output_at : rb.b.data());
    }
    return p;
}

// The same layout in device memory.
struct DeviceSetup {
    std::vector<unsigned char*> a;
    std::vector<unsigned char*> b;
    Pointers pointers;

    DeviceSetup() = default;
    DeviceSetup(const DeviceSetup&) = delete;
    DeviceSetup& operator=(const DeviceSetup&) = delete;
    ~DeviceSetup() {
        for (unsigned char* p : a) cudaFree(p);
        for (unsigned char* p : b) cudaFree(p);
    }

    bool upload(const Setup& s, bool in_place) {
        for (const RankBytes& rb : s.ranks) {
            unsigned char* da = nullptr;
            unsigned char* db = nullptr;
            if (!cuda_ok(cudaMalloc(&da, std::max<size_t>(rb.a.size(), 1)), "cudaMalloc")) return false;
            a.push_back(da);
            if (!cuda_ok(cudaMemcpy(da, rb.a.data(), rb.a.size(), cudaMemcpyHostToDevice), "upload")) return false;
            if (!in_place) {
                if (!cuda_ok(cudaMalloc(&db, std::max<size_t>(rb.b.size(), 1)), "cudaMalloc")) return false;
                b.push_back(db);
                if (!cuda_ok(cudaMemcpy(db, rb.b.data(), rb.b.size(), cudaMemcpyHostToDevice), "upload")) return false;
            }
            pointers.inputs.push_back(da + rb.input_at);
            pointers.outputs.push_back(in_place ? da + rb.output_at : db);
        }
        return true;
    }

    bool download(Setup& s) const {
        for (size_t r = 0; r < s.ranks.size(); ++r) {
            RankBytes& rb = s.ranks[r];
            if (!cuda_ok(cudaMemcpy(rb.a.data(), a[r], rb.a.size(), cudaMemcpyDeviceToHost), "download")) return false;
            if (!b.empty() && !cuda_ok(cudaMemcpy(rb.b.data(), b[r], rb.b.size(), cudaMemcpyDeviceToHost), "download")) {
                return false;
            }
        }
        return true;
    }
};

bool is_nan(const unsigned char* at, mlopt_dtype dtype) {
    uint32_t bits = 0;
    switch (dtype) {
        case MLOPT_FLOAT32: std::memcpy(&bits, at, 4); return (bits & 0x7fffffffu) > 0x7f800000u;
        case MLOPT_FLOAT16: std::memcpy(&bits, at, 2); return (bits & 0x7fffu) > 0x7c00u;
        case MLOPT_BFLOAT16: std::memcpy(&bits, at, 2); return (bits & 0x7fffu) > 0x7f80u;
        case MLOPT_INT32: return false;
    }
    return false;
}

// "" when every element agrees bit for bit, else where the first difference is. A NaN that arithmetic made
// (inf * 0 in a product) agrees with any NaN: its sign and payload are the hardware's choice (x86 makes
// 0xffc00000, the GPU 0x7fffffff) and no input here is a NaN.
std::string first_difference(const Setup& cpu, const Setup& gpu, mlopt_dtype dtype) {
    const size_t es = mlopt::dtype_size(dtype);
    for (size_t r = 0; r < cpu.ranks.size(); ++r) {
        const std::vector<unsigned char>* pairs[2][2] = {{&cpu.ranks[r].a, &gpu.ranks[r].a},
                                                         {&cpu.ranks[r].b, &gpu.ranks[r].b}};
        for (int k = 0; k < 2; ++k) {
            const auto& x = *pairs[k][0];
            const auto& y = *pairs[k][1];
            for (size_t at = 0; at + es <= x.size(); at += es) {
                if (std::memcmp(x.data() + at, y.data() + at, es) == 0) continue;
                if (is_nan(x.data() + at, dtype) && is_nan(y.data() + at, dtype)) continue;
                return "rank " + std::to_string(r) + (k == 0 ? " buffer a" : " buffer b") + " byte " +
                       std::to_string(at) + " (cpu " + std::to_string(x[at]) + ", gpu " + std::to_string(y[at]) + ")";
            }
        }
    }
    return "";
}

// ------------------------------------------------------------------------------------------------ runs

struct Case {
    mlopt_dtype dtype;
    mlopt_redop op;
    size_t chunk_elems;
    int64_t chunk_bytes;
    int32_t fifo_slots;
    bool in_place;
};

mlopt_run_options options_for(const Case& c, mlopt_backend backend) {
    mlopt_run_options o;
    mlopt_run_options_init(&o);
    o.backend = backend;
    o.chunk_bytes = c.chunk_bytes;
    o.fifo_slots = c.fifo_slots;
    o.watchdog_ms = 20000;
    return o;
}

mlopt_run_stats stats_of(mlopt_comm comm) {
    mlopt_run_stats stats{};
    stats.struct_size = sizeof stats;
    mlopt_comm_last_stats(comm, &stats);
    return stats;
}

std::string case_name(const std::string& file, const Case& c) {
    return fs::path(file).filename().string() + " " + mlopt::dtype_name(c.dtype) + " " + mlopt::redop_name(c.op) +
           " chunk_elems=" + std::to_string(c.chunk_elems) + " chunk_bytes=" + std::to_string(c.chunk_bytes) +
           " fifo=" + std::to_string(c.fifo_slots) + (c.in_place ? " in place" : "");
}

void run_case(const mlopt::Plan& plan, const mlopt_program_info& info, const std::string& file, const Case& c,
              uint64_t seed) {
    const std::string name = case_name(file, c);
    Setup cpu = make_setup(info, info.coll, c.chunk_elems, c.dtype, c.op, c.in_place, seed);
    Setup gpu = cpu;
    DeviceSetup device;
    if (!CHECK(device.upload(gpu, c.in_place))) return;
    mlopt_comm comm = nullptr;
    mlopt_comm_create_local(info.ngpus, &comm, nullptr);
    Pointers host = host_pointers(cpu, c.in_place);
    const mlopt_run_options on_cpu = options_for(c, MLOPT_BACKEND_CPU);
    const mlopt_run_options on_gpu = options_for(c, MLOPT_BACKEND_CUDA);
    mlopt_error err = nullptr;
    mlopt_status status = mlopt_comm_run(comm, plan.get(), host.inputs.data(), host.outputs.data(), cpu.count,
                                         c.dtype, c.op, &on_cpu, &err);
    if (!check::record(status == MLOPT_OK, __FILE__, __LINE__, name + ": cpu: " + (err ? mlopt_error_message(err) : ""))) {
        mlopt_error_free(err);
        mlopt_comm_free(comm);
        return;
    }
    const mlopt_run_stats cpu_stats = stats_of(comm);
    status = mlopt_comm_run(comm, plan.get(), device.pointers.inputs.data(), device.pointers.outputs.data(), gpu.count,
                            c.dtype, c.op, &on_gpu, &err);
    const bool ran = check::record(status == MLOPT_OK, __FILE__, __LINE__,
                                   name + ": gpu: " + (err ? mlopt_error_message(err) : ""));
    mlopt_error_free(err);
    const mlopt_run_stats gpu_stats = stats_of(comm);
    mlopt_comm_free(comm);
    if (!ran || !CHECK(device.download(gpu))) return;
    const std::string difference = first_difference(cpu, gpu, c.dtype);
    check::record(difference.empty(), __FILE__, __LINE__, name + ": outputs differ at " + difference);
    const bool same_counts = gpu_stats.steps_executed == cpu_stats.steps_executed &&
                             gpu_stats.messages == cpu_stats.messages && gpu_stats.bytes_moved == cpu_stats.bytes_moved &&
                             gpu_stats.loop_iterations == cpu_stats.loop_iterations;
    check::record(same_counts, __FILE__, __LINE__, name + ": the GPU's counters differ from the CPU's");
    check::record(gpu_stats.backend == MLOPT_BACKEND_CUDA && gpu_stats.device_us > 0, __FILE__, __LINE__,
                  name + ": GPU stats name the backend and time the kernel");
}

std::vector<Case> cases_for(const mlopt_program_info& info) {
    const std::vector<Case> all = {
        {MLOPT_FLOAT32, MLOPT_SUM, 1001, 0, 0, false},          // odd chunks: element-by-element tails
        {MLOPT_FLOAT32, MLOPT_SUM, 4096, 4096, 0, false},       // 4 slices per chunk
        {MLOPT_FLOAT32, MLOPT_SUM, 3000, 1000, 1, false},       // 12 slices, one message in flight
        {MLOPT_FLOAT32, MLOPT_SUM, 65536 + 12, 1 << 16, 2, false},  // big enough for every thread
        {MLOPT_FLOAT16, MLOPT_SUM, 2051, 0, 0, false},
        {MLOPT_FLOAT16, MLOPT_MAX, 777, 512, 0, false},
        {MLOPT_BFLOAT16, MLOPT_SUM, 1024, 0, 0, false},
        {MLOPT_BFLOAT16, MLOPT_PROD, 333, 256, 0, false},
        {MLOPT_INT32, MLOPT_MIN, 640, 0, 0, false},
        {MLOPT_INT32, MLOPT_SUM, 1000, 400, 0, false},
        {MLOPT_FLOAT32, MLOPT_SUM, 1024, 0, 0, true},
        {MLOPT_FLOAT16, MLOPT_SUM, 500, 256, 1, true},
        {MLOPT_FLOAT32, MLOPT_MIN, 999, 1200, 0, true},
    };
    std::vector<Case> out;
    for (const Case& c : all) {
        if (c.in_place ? info.inplace : info.outofplace) out.push_back(c);
    }
    return out;
}

void test_every_xml_matches_the_cpu_backend() {
    const std::vector<std::string> files = xml_files();
    CHECK(files.size() >= 10);
    size_t runs = 0;
    for (const std::string& file : files) {
        const mlopt::Plan plan = mlopt::Plan::load(file);
        const mlopt_program_info info = plan.program_info();
        uint64_t seed = 1;
        for (const Case& c : cases_for(info)) {
            run_case(plan, info, file, c, seed++);
            ++runs;
        }
    }
    std::printf("  %zu XMLs, %zu runs on both backends\n", files.size(), runs);
}

// ------------------------------------------------------------------------------------------------ errors

// A plan read from XML without validate_program: the loader refuses a certain deadlock up front (validate.cpp
// check_deadlock), and these tests are about the GPU's own watchdog behind it.
mlopt_plan_s unvalidated_plan(const std::string& xml, const char* name) {
    const mlopt::XmlDocument doc = mlopt::parse_xml(xml, name);
    mlopt::ProgramSource where;
    where.file = name;
    mlopt_plan_s plan;
    plan.kind = MLOPT_PLAN_MSCCL_XML;
    plan.source = name;
    plan.format = "msccl-ef";
    plan.planner = "collective";
    plan.program = mlopt::read_msccl_program(doc, where);
    return plan;
}

// Both ranks receive before they send: structurally valid, but no step can start.
std::string both_receive_first() {
    const std::string tail = R"( cnt="1" depid="-1" deps="-1" hasdep="0"/>)";
    std::string gpus;
    for (int me = 0; me < 2; ++me) {
        const std::string peer = std::to_string(1 - me);
        const std::string self = std::to_string(me);
        gpus += "<gpu id=\"" + self + R"(" i_chunks="1" o_chunks="2" s_chunks="0"><tb id="0" send=")" + peer +
                "\" recv=\"" + peer + R"(" chan="0">)" +
                R"(<step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff=")" + peer + "\"" + tail +
                R"(<step s="1" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff=")" + self + "\"" + tail +
                "</tb></gpu>";
    }
    return R"(<algo name="deadlock" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" )"
           R"(inplace="0" outofplace="1" minBytes="0" maxBytes="0">)" + gpus + "</algo>";
}

void test_deadlock_is_reported() {
    const std::string xml = both_receive_first();
    mlopt_plan refused = nullptr;
    mlopt_error load_err = nullptr;
    CHECK_EQ(mlopt_plan_load_memory(xml.data(), xml.size(), "deadlock.xml", &refused, &load_err), MLOPT_ERR_SEMANTIC);
    CHECK_CONTAINS(std::string(load_err ? mlopt_error_message(load_err) : ""), "deadlock: waits for a message from gpu 1");
    mlopt_error_free(load_err);
    mlopt_plan_free(refused);  // NULL unless the loader let the deadlock through

    const mlopt_plan_s plan = unvalidated_plan(xml, "deadlock.xml");
    DeviceSetup device;
    mlopt_program_info info{};
    info.struct_size = sizeof info;
    CHECK_EQ(mlopt_plan_program_info(&plan, &info, nullptr), MLOPT_OK);
    Setup s = make_setup(info, info.coll, 64, MLOPT_FLOAT32, MLOPT_SUM, false, 3);
    if (!CHECK(device.upload(s, false))) return;
    mlopt_comm comm = nullptr;
    mlopt_comm_create_local(2, &comm, nullptr);
    mlopt_run_options o;
    mlopt_run_options_init(&o);
    o.backend = MLOPT_BACKEND_CUDA;
    o.watchdog_ms = 200;
    mlopt_error err = nullptr;
    const mlopt_status status = mlopt_comm_run(comm, &plan, device.pointers.inputs.data(),
                                               device.pointers.outputs.data(), s.count, MLOPT_FLOAT32, MLOPT_SUM, &o,
                                               &err);
    CHECK_EQ(status, MLOPT_ERR_DEADLOCK);
    const std::string message = err ? mlopt_error_message(err) : "";
    CHECK_CONTAINS(message, "deadlock.xml: deadlock: no step completed for 200 ms");
    CHECK_CONTAINS(message, "rank 0 tb 0 step 0 (r) waits for a message from rank 1 on channel 0");
    CHECK_CONTAINS(message, "rank 1 tb 0 step 0 (r) waits for a message from rank 0 on channel 0");
    mlopt_error_free(err);
    // The communicator (and the GPU) stay usable: a good program runs next.
    const mlopt::Plan ring = mlopt::Plan::load(data_dir() + "/ring4_allgather.xml");
    mlopt_comm_free(comm);
    const mlopt_program_info ring_info = ring.program_info();
    run_case(ring, ring_info, "ring4_allgather.xml after a deadlock", {MLOPT_FLOAT32, MLOPT_SUM, 100, 0, 0, false}, 4);
}

// Programs built in code skip the loader's checks, to reach the run-time checks behind them.
mlopt::Step step(mlopt::StepType type, mlopt::Buffer src, int32_t srcoff, mlopt::Buffer dst, int32_t dstoff,
                 int32_t cnt, int32_t depid = -1, int32_t deps = -1, bool hasdep = false) {
    mlopt::Step s;
    s.type = type;
    s.srcbuf = src;
    s.srcoff = srcoff;
    s.dstbuf = dst;
    s.dstoff = dstoff;
    s.cnt = cnt;
    s.depid = depid;
    s.deps = deps;
    s.hasdep = hasdep;
    return s;
}

mlopt::Program two_rank_program(const char* coll, int32_t chunks) {
    mlopt::Program p;
    p.name = "handmade";
    p.proto = "Simple";
    p.nchannels = 1;
    p.nchunksperloop = chunks;
    p.ngpus = 2;
    p.coll = coll;
    for (int32_t r = 0; r < 2; ++r) {
        mlopt::Gpu gpu;
        gpu.id = r;
        gpu.i_chunks = chunks;
        gpu.o_chunks = chunks;
        p.gpus.push_back(gpu);
    }
    return p;
}

mlopt::Threadblock threadblock(int32_t id, int32_t send, int32_t recv, std::vector<mlopt::Step> steps) {
    mlopt::Threadblock tb;
    tb.id = id;
    tb.send = send;
    tb.recv = recv;
    tb.steps = std::move(steps);
    return tb;
}

mlopt::RunResult run_built(const mlopt::Program& p, size_t chunk_elems, int64_t chunk_bytes, int32_t watchdog_ms,
                           std::vector<float*>& buffers) {
    mlopt::RunRequest request;
    request.chunk_elems = chunk_elems;
    request.chunk_bytes = chunk_bytes;
    request.watchdog_ms = watchdog_ms;
    for (size_t r = 0; r < p.gpus.size(); ++r) {
        float* in = nullptr;
        float* out = nullptr;
        cudaMalloc(&in, chunk_elems * 4 * p.gpus[r].i_chunks);
        cudaMalloc(&out, chunk_elems * 4 * p.gpus[r].o_chunks);
        buffers.push_back(in);
        buffers.push_back(out);
        request.ranks.push_back({reinterpret_cast<std::byte*>(in), reinterpret_cast<std::byte*>(out)});
    }
    mlopt::CudaWorkspacePtr workspace;
    return mlopt::run_program_cuda(p, request, workspace);
}

void test_run_time_checks() {
    using mlopt::Buffer;
    using mlopt::StepType;
    std::vector<float*> buffers;
    {  // unpaired sends: the receiver's second message comes from the sender's next loop iteration
        mlopt::Program p = two_rank_program("allgather", 1);
        p.gpus[0].tbs.push_back(threadblock(0, 1, -1, {step(StepType::s, Buffer::input, 0, Buffer::output, 0, 1)}));
        p.gpus[1].tbs.push_back(threadblock(0, -1, 0, {step(StepType::r, Buffer::input, 0, Buffer::output, 0, 1),
                                                       step(StepType::r, Buffer::input, 0, Buffer::output, 0, 1)}));
        const mlopt::RunResult r = run_built(p, 10, 16, 5000, buffers);
        CHECK_EQ(r.status, MLOPT_ERR_SEMANTIC);
        CHECK_CONTAINS(r.message, "rank 1 tb 0 step 1 (r) of loop iteration 0 receives a message of loop iteration 1");
    }
    {  // cnt mismatch
        mlopt::Program p = two_rank_program("allgather", 2);
        p.gpus[0].tbs.push_back(threadblock(0, 1, -1, {step(StepType::s, Buffer::input, 0, Buffer::output, 0, 2)}));
        p.gpus[1].tbs.push_back(threadblock(0, -1, 0, {step(StepType::r, Buffer::input, 0, Buffer::output, 0, 1)}));
        const mlopt::RunResult r = run_built(p, 8, 0, 5000, buffers);
        CHECK_EQ(r.status, MLOPT_ERR_SEMANTIC);
        CHECK_CONTAINS(r.message, "rank 1 tb 0 step 0 (r) receives cnt=1 but the matching send from rank 0 on "
                                  "channel 0 has cnt=2");
    }
    {  // a dependency on a step that never signals (no hasdep)
        mlopt::Program p = two_rank_program("allreduce", 1);
        p.ngpus = 1;
        p.gpus.pop_back();
        p.gpus[0].tbs.push_back(threadblock(0, -1, -1, {step(StepType::cpy, Buffer::input, 0, Buffer::output, 0, 1)}));
        p.gpus[0].tbs.push_back(
            threadblock(1, -1, -1, {step(StepType::re, Buffer::input, 0, Buffer::output, 0, 1, 0, 0, false)}));
        const mlopt::RunResult r = run_built(p, 8, 0, 100, buffers);
        CHECK_EQ(r.status, MLOPT_ERR_DEADLOCK);
        CHECK_CONTAINS(r.message, "rank 0 tb 1 step 0 (re) waits for tb 0 to complete step 0 (hasdep)");
    }
    for (float* b : buffers) cudaFree(b);
}

void test_host_pointers_are_refused() {
    const mlopt::Plan plan = mlopt::Plan::load(data_dir() + "/ring4_allgather.xml");
    const mlopt_program_info info = plan.program_info();
    Setup s = make_setup(info, info.coll, 16, MLOPT_FLOAT32, MLOPT_SUM, false, 5);
    Pointers host = host_pointers(s, false);
    mlopt_comm comm = nullptr;
    mlopt_comm_create_local(info.ngpus, &comm, nullptr);
    mlopt_run_options o;
    mlopt_run_options_init(&o);
    o.backend = MLOPT_BACKEND_CUDA;
    mlopt_error err = nullptr;
    CHECK_EQ(mlopt_comm_run(comm, plan.get(), host.inputs.data(), host.outputs.data(), s.count, MLOPT_FLOAT32,
                            MLOPT_SUM, &o, &err),
             MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(err ? mlopt_error_message(err) : "", "inputs[0] is host memory the GPU cannot address");
    mlopt_error_free(err);
    o.cuda_block_threads = 100;  // not a multiple of 32
    CHECK_EQ(mlopt_comm_run(comm, plan.get(), host.inputs.data(), host.outputs.data(), s.count, MLOPT_FLOAT32,
                            MLOPT_SUM, &o, nullptr),
             MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_comm_free(comm);
}

// ------------------------------------------------------------------------------------------------ bench

int bench(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: test_cuda_backend bench FILE BYTES [CHUNK_BYTES] [BLOCK_THREADS] [ITERATIONS]\n");
        return 2;
    }
    const std::string file = argv[2];
    const size_t bytes = std::strtoull(argv[3], nullptr, 10);
    const int64_t chunk_bytes = argc > 4 ? std::strtoll(argv[4], nullptr, 10) : 0;
    const int32_t block_threads = argc > 5 ? static_cast<int32_t>(std::strtol(argv[5], nullptr, 10)) : 0;
    const int iterations = argc > 6 ? std::atoi(argv[6]) : 20;
    const mlopt::Plan plan = mlopt::Plan::load(file);
    const mlopt_program_info info = plan.program_info();
    const auto ic = static_cast<size_t>(info.i_chunks);
    const auto oc = static_cast<size_t>(info.o_chunks);
    const size_t chunk_elems = std::max<size_t>(1, bytes / 4 / std::max(ic, oc));
    // Timing only (test_every_xml_matches_the_cpu_backend checks the results): device buffers filled with a
    // constant pattern (float32 1.0f + ...) instead of host random data, which takes seconds per run at 256 MiB.
    DeviceSetup device;
    for (int32_t r = 0; r < info.ngpus; ++r) {
        unsigned char* in = nullptr;
        unsigned char* out = nullptr;
        if (!cuda_ok(cudaMalloc(&in, chunk_elems * 4 * ic), "cudaMalloc") ||
            !cuda_ok(cudaMalloc(&out, chunk_elems * 4 * oc), "cudaMalloc")) {
            return 1;
        }
        device.a.push_back(in);
        device.b.push_back(out);
        cudaMemset(in, 0x3f, chunk_elems * 4 * ic);
        cudaMemset(out, 0, chunk_elems * 4 * oc);
        device.pointers.inputs.push_back(in);
        device.pointers.outputs.push_back(out);
    }
    const size_t count = chunk_elems * ic;
    mlopt_comm comm = nullptr;
    mlopt_comm_create_local(info.ngpus, &comm, nullptr);
    mlopt_run_options o;
    mlopt_run_options_init(&o);
    o.backend = MLOPT_BACKEND_CUDA;
    o.chunk_bytes = chunk_bytes;
    o.cuda_block_threads = block_threads;
    std::vector<double> device_us;
    std::vector<double> wall_us;
    mlopt_run_stats stats{};
    for (int i = 0; i < iterations + 3; ++i) {  // three warm-up runs
        mlopt_error err = nullptr;
        if (mlopt_comm_run(comm, plan.get(), device.pointers.inputs.data(), device.pointers.outputs.data(), count,
                           MLOPT_FLOAT32, MLOPT_SUM, &o, &err) != MLOPT_OK) {
            std::fprintf(stderr, "%s: %s\n", file.c_str(), err ? mlopt_error_message(err) : "?");
            mlopt_error_free(err);
            return 1;
        }
        stats = stats_of(comm);
        if (i >= 3) {
            device_us.push_back(stats.device_us);
            wall_us.push_back(stats.wall_us);
        }
    }
    mlopt_comm_free(comm);
    std::sort(device_us.begin(), device_us.end());
    std::sort(wall_us.begin(), wall_us.end());
    const double device_median = device_us[device_us.size() / 2];
    const double wall_median = wall_us[wall_us.size() / 2];
    const size_t moved = chunk_elems * 4 * std::max(ic, oc);  // nccl-tests' size, as actually run

    // cudaMemcpy device to device of the same bytes: one copy stream, the physical reference.
    unsigned char* x = nullptr;
    unsigned char* y = nullptr;
    cudaMalloc(&x, moved);
    cudaMalloc(&y, moved);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    std::vector<double> copy_us;
    for (int i = 0; i < iterations + 3; ++i) {
        cudaEventRecord(start);
        cudaMemcpy(y, x, moved, cudaMemcpyDeviceToDevice);
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        if (i >= 3) copy_us.push_back(ms * 1e3);
    }
    cudaFree(x);
    cudaFree(y);
    std::sort(copy_us.begin(), copy_us.end());
    const double copy_median = copy_us[copy_us.size() / 2];
    cudaDeviceProp prop{};
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    std::printf("{\"file\": \"%s\", \"coll\": \"%s\", \"ranks\": %d, \"threadblocks\": %d, \"bytes\": %zu, "
                "\"chunk_bytes\": %lld, \"block_threads\": %d, \"iterations\": %d, \"device_us\": %.3f, "
                "\"wall_us\": %.3f, \"algbw_GBps\": %.3f, \"memcpy_us\": %.3f, \"memcpy_GBps\": %.3f, "
                "\"steps\": %lld, \"loop_iterations\": %lld, \"bytes_moved\": %lld, \"gpu\": \"%s\"}\n",
                fs::path(file).filename().string().c_str(), info.coll, info.ngpus, info.threadblocks, moved,
                static_cast<long long>(chunk_bytes), block_threads > 0 ? block_threads : 512, iterations,
                device_median, wall_median, static_cast<double>(moved) / device_median / 1e3, copy_median,
                static_cast<double>(moved) / copy_median / 1e3, static_cast<long long>(stats.steps_executed),
                static_cast<long long>(stats.loop_iterations), static_cast<long long>(stats.bytes_moved), prop.name);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mlopt_error err = nullptr;
    if (mlopt_backend_available(MLOPT_BACKEND_CUDA, &err) != MLOPT_OK) {
        std::printf("test_cuda_backend: skipped: %s\n", err ? mlopt_error_message(err) : "no CUDA backend");
        mlopt_error_free(err);
        return 77;
    }
    if (argc > 1 && std::strcmp(argv[1], "bench") == 0) return bench(argc, argv);
    test_every_xml_matches_the_cpu_backend();
    test_deadlock_is_reported();
    test_run_time_checks();
    test_host_pointers_are_refused();
    return check::finish("test_cuda_backend");
}
