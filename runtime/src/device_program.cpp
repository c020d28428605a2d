// Flattening a Program for the CUDA backend, and the host-side reports of a GPU run (device_program.hpp).
#include "device_program.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "step_ops.hpp"
#include "validate.hpp"

namespace mlopt {
namespace device {
namespace {

constexpr int64_t kSlotAlignment = 16;  // the kernel moves 16-byte vectors

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }


Step flatten_step(const mlopt::Step& st, int32_t first_tb_of_rank) {
    Step out{};
    out.srcoff = st.srcoff;
    out.dstoff = st.dstoff;
    out.cnt = st.cnt;
    out.dep_tb = st.depid >= 0 ? first_tb_of_rank + st.depid : -1;
    out.dep_step = st.deps;
    out.type = static_cast<uint8_t>(st.type);
    out.srcbuf = static_cast<uint8_t>(st.srcbuf);
    out.dstbuf = static_cast<uint8_t>(st.dstbuf);
    out.signal = st.hasdep && st.type != StepType::nop ? 1 : 0;  // the executor never signals nops
    return out;
}

std::string tb_label(const Program& program, const Threadblock& tb, const ThreadblockExit& exit,
                     int64_t iterations) {
    const auto& steps = program.gpus[tb.rank].tbs[tb.id].steps;
    std::string label = "rank " + std::to_string(tb.rank) + " tb " + std::to_string(tb.id);
    if (exit.pc < 0 || exit.pc >= static_cast<int32_t>(steps.size())) return label;
    label += " step " + std::to_string(exit.pc) + " (" + step_type_name(steps[exit.pc].type) + ")";
    if (iterations > 1) label += " of loop iteration " + std::to_string(exit.iteration);
    return label;
}

std::string wait_text(const Program& program, const Layout& layout, size_t g, const ThreadblockExit& exit) {
    const Threadblock& tb = layout.tbs[g];
    switch (exit.state) {
        case kExitWaitDependency: {
            const Step& st = layout.steps[tb.first_step + exit.pc];
            const Threadblock& target = layout.tbs[st.dep_tb];
            return "waits for tb " + std::to_string(target.id) + " to complete step " + std::to_string(st.dep_step) +
                   " (hasdep)";
        }
        case kExitWaitMessage: {
            const Connection& c = layout.conns[tb.recv_conn];
            return "waits for a message from rank " + std::to_string(c.from) + " on channel " + std::to_string(c.chan);
        }
        case kExitWaitSpace: {
            const Connection& c = layout.conns[tb.send_conn];
            return "cannot send to rank " + std::to_string(c.to) + " on channel " + std::to_string(c.chan) +
                   ": FIFO full (" + std::to_string(c.capacity) + " messages in flight)";
        }
        case kExitNotStarted: return "never started";
        default: break;
    }
    (void)program;
    return "is running";
}

std::string describe_bad_message(const Program& program, const Layout& layout,
                                 const std::vector<ThreadblockExit>& exits) {
    for (size_t g = 0; g < exits.size(); ++g) {
        const ThreadblockExit& e = exits[g];
        if (e.state != kExitBadMessage) continue;
        const Threadblock& tb = layout.tbs[g];
        const Connection& c = layout.conns[tb.recv_conn];
        const Step& st = layout.steps[tb.first_step + e.pc];
        const std::string receiver = tb_label(program, tb, e, layout.iterations);
        const std::string sender = "the matching send from rank " + std::to_string(c.from) + " on channel " +
                                   std::to_string(c.chan);
        if (e.got_cnt != st.cnt) {
            return receiver + " receives cnt=" + std::to_string(st.cnt) + " but " + sender + " has cnt=" +
                   std::to_string(e.got_cnt);
        }
        return receiver + " receives a message of loop iteration " + std::to_string(e.got_iteration) + " from " +
               sender + ": the sends and receives on this connection do not pair up";
    }
    return "a received message did not match its step";
}

}  // namespace

Layout make_layout(const Program& program, size_t chunk_elems, size_t elem_size, int64_t chunk_bytes,
                   int32_t fifo_slots) {
    Layout layout;
    layout.chunk_elems = static_cast<int64_t>(chunk_elems);
    layout.slice_elems = layout.chunk_elems;
    if (chunk_bytes > 0) {
        const int64_t per_slice = chunk_bytes / static_cast<int64_t>(elem_size);
        layout.slice_elems = std::min(layout.chunk_elems, std::max<int64_t>(per_slice, 1));
    }
    layout.iterations = chunk_elems == 0 ? 0 : (layout.chunk_elems + layout.slice_elems - 1) / layout.slice_elems;

    std::map<std::tuple<int32_t, int32_t, int32_t>, int32_t> conn_index;  // (from, to, chan) -> index
    auto connection = [&](int32_t from, int32_t to, int32_t chan) {
        const auto [it, inserted] = conn_index.emplace(std::make_tuple(from, to, chan), 0);
        if (inserted) {
            it->second = static_cast<int32_t>(layout.conns.size());
            Connection c{};
            c.from = from;
            c.to = to;
            c.chan = chan;
            layout.conns.push_back(c);
        }
        return it->second;
    };
    std::vector<int32_t> largest_cnt;  // per connection: most chunks one message carries
    for (const Gpu& gpu : program.gpus) {
        const auto first_tb = static_cast<int32_t>(layout.tbs.size());
        layout.scratch_bytes.push_back(static_cast<int64_t>(gpu.s_chunks) * layout.chunk_elems *
                                       static_cast<int64_t>(elem_size));
        for (const mlopt::Threadblock& tb : gpu.tbs) {
            Threadblock out{};
            out.rank = gpu.id;
            out.id = tb.id;
            out.first_step = static_cast<int32_t>(layout.steps.size());
            out.nsteps = static_cast<int32_t>(tb.steps.size());
            out.send_conn = tb.send >= 0 ? connection(gpu.id, tb.send, tb.chan) : -1;
            out.recv_conn = tb.recv >= 0 ? connection(tb.recv, gpu.id, tb.chan) : -1;
            largest_cnt.resize(layout.conns.size(), 0);
            for (const mlopt::Step& st : tb.steps) {
                layout.steps.push_back(flatten_step(st, first_tb));
                if (st.cnt > 0 && step_sends(st.type)) {
                    Connection& c = layout.conns[out.send_conn];
                    ++c.messages;
                    largest_cnt[out.send_conn] = std::max(largest_cnt[out.send_conn], st.cnt);
                }
            }
            layout.tbs.push_back(out);
        }
    }
    for (size_t i = 0; i < layout.conns.size(); ++i) {
        Connection& c = layout.conns[i];
        const int32_t wanted = std::max(c.messages, 1);
        c.capacity = fifo_slots > 0 ? std::min(fifo_slots, wanted) : wanted;
        c.slots = c.capacity + 1;
        c.slot_bytes = round_up(std::max<int64_t>(int64_t{largest_cnt[i]} * layout.slice_elems *
                                                      static_cast<int64_t>(elem_size), 1),
                                kSlotAlignment);
        c.slot_offset = layout.fifo_bytes;
        c.meta_offset = layout.meta_slots;
        layout.fifo_bytes += c.slot_bytes * c.slots;
        layout.meta_slots += c.slots;
    }
    return layout;
}

mlopt_run_stats completed_stats(const Program& program, const Layout& layout, size_t elem_size) {
    mlopt_run_stats stats{};
    stats.struct_size = sizeof stats;
    stats.loop_iterations = layout.iterations;
    for (int64_t it = 0; it < layout.iterations; ++it) {
        const int64_t len = std::min(layout.slice_elems, layout.chunk_elems - it * layout.slice_elems);
        for (const Gpu& gpu : program.gpus) {
            for (const mlopt::Threadblock& tb : gpu.tbs) {
                for (const mlopt::Step& st : tb.steps) {
                    ++stats.steps_executed;
                    if (st.cnt > 0 && step_sends(st.type)) ++stats.messages;
                    stats.bytes_moved +=
                        int64_t{st.cnt} * len * static_cast<int64_t>(elem_size) * step_copies(st.type);
                }
            }
        }
    }
    return stats;
}

std::string describe_stop(const Program& program, const Layout& layout, int32_t reason,
                          const std::vector<ThreadblockExit>& exits, int32_t watchdog_ms) {
    if (reason == kStopBadMessage) return describe_bad_message(program, layout, exits);
    ThreadblockList list;
    for (size_t g = 0; g < exits.size() && g < layout.tbs.size(); ++g) {
        const ThreadblockExit& e = exits[g];
        if (e.state == kExitFinished) continue;
        list.add([&] {
            return tb_label(program, layout.tbs[g], e, layout.iterations) + " " + wait_text(program, layout, g, e);
        });
    }
    return "deadlock: no step completed for " + std::to_string(watchdog_ms) + " ms: " + list.text();
}

}  // namespace device
}  // namespace mlopt
