// The CUDA backend's host side, which needs no GPU (src/device_program.cpp): every reference XML flattens into
// tables that index what the program says, FIFO slots are sized for the largest message and never overlap,
// a completed run's counters equal what the CPU backend counts, and a stopped kernel's report reads like the
// CPU backend's. Runs in every build.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "check.hpp"
#include "device_program.hpp"
#include "handles.hpp"
#include "mlopt/mlopt.h"
#include "mlopt/mlopt.hpp"
#include "reduce.hpp"
#include "validate.hpp"

namespace {

std::string data_path(const char* name) {
    const char* repo = std::getenv("MLOPT_REPO");
    return (repo ? std::string(repo) + "/runtime/tests/data/" : std::string("data/")) + name;
}

const char* kFiles[] = {
    "rccl_alltoall-8n-0-9kb.xml", "msccl-scheduler_ncv4_ag_hier_4_LL.xml", "handmade_nop_deps_2gpu.xml",
    "ring4_allgather.xml",        "ring4_allreduce.xml",                   "ring4_alltoall.xml",
    "ring4_reducescatter_legacy.xml", "switch4_broadcast_legacy.xml",      "ndv2_allreduce_tree.xml",
    "ndv2_allgather_taccl.xml",
};

void check_tables(const mlopt::Program& p, const mlopt::device::Layout& layout, size_t elem_size, int32_t fifo) {
    size_t g = 0;
    for (const mlopt::Gpu& gpu : p.gpus) {
        for (const mlopt::Threadblock& tb : gpu.tbs) {
            const mlopt::device::Threadblock& t = layout.tbs[g++];
            CHECK_EQ(t.rank, gpu.id);
            CHECK_EQ(t.id, tb.id);
            CHECK_EQ(t.nsteps, static_cast<int32_t>(tb.steps.size()));
            for (size_t s = 0; s < tb.steps.size(); ++s) {
                const mlopt::device::Step& st = layout.steps[t.first_step + s];
                CHECK_EQ(st.cnt, tb.steps[s].cnt);
                CHECK_EQ(static_cast<int>(st.type), static_cast<int>(tb.steps[s].type));
                if (tb.steps[s].depid >= 0) {
                    // The flat index names the same rank's threadblock.
                    CHECK_EQ(layout.tbs[st.dep_tb].rank, gpu.id);
                    CHECK_EQ(layout.tbs[st.dep_tb].id, tb.steps[s].depid);
                }
                CHECK_EQ(st.signal, tb.steps[s].hasdep && tb.steps[s].type != mlopt::StepType::nop ? 1 : 0);
            }
            if (tb.send >= 0) {
                const mlopt::device::Connection& c = layout.conns[t.send_conn];
                CHECK(c.from == gpu.id && c.to == tb.send && c.chan == tb.chan);
            }
            if (tb.recv >= 0) {
                const mlopt::device::Connection& c = layout.conns[t.recv_conn];
                CHECK(c.from == tb.recv && c.to == gpu.id && c.chan == tb.chan);
            }
        }
    }
    CHECK_EQ(g, layout.tbs.size());
    int64_t end = 0;
    int32_t meta = 0;
    for (const mlopt::device::Connection& c : layout.conns) {
        CHECK(c.capacity >= 1 && c.slots == c.capacity + 1);
        CHECK(fifo <= 0 ? c.capacity == std::max(c.messages, 1) : c.capacity == std::min(fifo, std::max(c.messages, 1)));
        CHECK(c.slot_bytes % 16 == 0);
        CHECK_EQ(c.slot_offset, end);  // slots of connections follow each other without overlap
        CHECK_EQ(c.meta_offset, meta);
        end += c.slot_bytes * c.slots;
        meta += c.slots;
    }
    CHECK_EQ(end, layout.fifo_bytes);
    // Every sending step's message fits its slot.
    for (const mlopt::device::Threadblock& t : layout.tbs) {
        if (t.send_conn < 0) continue;
        for (int32_t s = 0; s < t.nsteps; ++s) {
            const mlopt::device::Step& st = layout.steps[t.first_step + s];
            if (mlopt::step_sends(static_cast<mlopt::StepType>(st.type))) {
                CHECK(int64_t{st.cnt} * layout.slice_elems * static_cast<int64_t>(elem_size) <=
                      layout.conns[t.send_conn].slot_bytes);
            }
        }
    }
}

void test_reference_programs_flatten() {
    for (const char* file : kFiles) {
        const mlopt::Plan plan = mlopt::Plan::load(data_path(file));
        const mlopt::Program& p = plan.get()->program;
        for (int64_t chunk_bytes : {int64_t{0}, int64_t{1000}}) {
            for (int32_t fifo : {0, 1, 3}) {
                const mlopt::device::Layout layout = mlopt::device::make_layout(p, 1001, 4, chunk_bytes, fifo);
                CHECK_EQ(layout.iterations, chunk_bytes == 0 ? 1 : (1001 + 249) / 250);
                check_tables(p, layout, 4, fifo);
            }
        }
    }
}

// The counters a GPU run reports (computed, not counted) equal what the CPU backend counts as it runs.
void test_completed_stats_equal_the_cpu_backends() {
    for (const char* file : kFiles) {
        const mlopt::Plan plan = mlopt::Plan::load(data_path(file));
        const mlopt_program_info info = plan.program_info();
        const size_t chunk_elems = 37;
        const size_t count = chunk_elems * static_cast<size_t>(info.i_chunks);
        const size_t out_count = plan.output_count(count);
        std::vector<std::vector<float>> in(info.ngpus, std::vector<float>(count, 1.0f));
        std::vector<std::vector<float>> out(info.ngpus, std::vector<float>(out_count));
        std::vector<void*> ins, outs;
        for (int32_t r = 0; r < info.ngpus; ++r) {
            ins.push_back(in[r].data());
            outs.push_back(out[r].data());
        }
        mlopt::Comm comm = mlopt::Comm::create_local(info.ngpus);
        mlopt_run_options o;
        mlopt_run_options_init(&o);
        o.chunk_bytes = 40;  // 10 elements: 4 iterations, the last one short
        comm.run(plan, ins.data(), outs.data(), count, MLOPT_FLOAT32, MLOPT_SUM, o);
        const mlopt_run_stats cpu = comm.last_stats();
        const mlopt::device::Layout layout = mlopt::device::make_layout(plan.get()->program, chunk_elems, 4, 40, 0);
        const mlopt_run_stats gpu = mlopt::device::completed_stats(plan.get()->program, layout, 4);
        CHECK_EQ(gpu.steps_executed, cpu.steps_executed);
        CHECK_EQ(gpu.messages, cpu.messages);
        CHECK_EQ(gpu.bytes_moved, cpu.bytes_moved);
        CHECK_EQ(gpu.loop_iterations, cpu.loop_iterations);
    }
}

void test_stop_reports() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    const mlopt::Program& p = plan.get()->program;
    const mlopt::device::Layout layout = mlopt::device::make_layout(p, 64, 4, 64, 1);  // 4 iterations
    std::vector<mlopt::device::ThreadblockExit> exits(layout.tbs.size());
    for (auto& e : exits) e.state = mlopt::device::kExitFinished;
    exits[0] = {mlopt::device::kExitWaitMessage, 0, 2, 0, 0};
    exits[1] = {mlopt::device::kExitWaitSpace, 1, 3, 0, 0};
    const std::string text = mlopt::device::describe_stop(p, layout, mlopt::device::kStopDeadlock, exits, 250);
    const mlopt::device::Threadblock& t0 = layout.tbs[0];
    const mlopt::device::Connection& in = layout.conns[t0.recv_conn];
    CHECK_CONTAINS(text, "deadlock: no step completed for 250 ms: rank 0 tb 0 step 0 (");
    CHECK_CONTAINS(text, "of loop iteration 2 waits for a message from rank " + std::to_string(in.from) +
                             " on channel " + std::to_string(in.chan));
    CHECK_CONTAINS(text, "FIFO full (1 messages in flight)");
    CHECK(text.find('\n') == std::string::npos);
    // Only unfinished threadblocks are named (every threadblock of rank 1 finished).
    CHECK(layout.tbs[2].rank == 1 || layout.tbs[2].rank == 0);
    CHECK(text.find("rank 1 tb") == std::string::npos);
}

}  // namespace

int main() {
    test_reference_programs_flatten();
    test_completed_stats_equal_the_cpu_backends();
    test_stop_reports();
    return check::finish("test_device_program");
}
