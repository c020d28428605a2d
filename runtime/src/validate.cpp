// Semantic checks of a Program (see validate.hpp): a port of mlopt/formats/msccl_contract.py, group for group
// and in the same order, so that both languages give a file the same verdict and name the same first
// problem (tests/conformance/msccl_xml holds them to it); the first problem found is reported, with its
// location.
#include "validate.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>
#include <utility>

namespace mlopt {

const char* step_type_name(StepType type) {
    switch (type) {
        case StepType::s: return "s";
        case StepType::r: return "r";
        case StepType::rcs: return "rcs";
        case StepType::rrs: return "rrs";
        case StepType::rrc: return "rrc";
        case StepType::rrcs: return "rrcs";
        case StepType::cpy: return "cpy";
        case StepType::re: return "re";
        case StepType::nop: return "nop";
    }
    return "?";
}

const char* buffer_name(Buffer buffer) {
    switch (buffer) {
        case Buffer::input: return "i";
        case Buffer::output: return "o";
        case Buffer::scratch: return "s";
    }
    return "?";
}

bool step_sends(StepType t) {
    return t == StepType::s || t == StepType::rcs || t == StepType::rrs || t == StepType::rrcs;
}

bool step_receives(StepType t) {
    return t == StepType::r || t == StepType::rcs || t == StepType::rrs || t == StepType::rrc || t == StepType::rrcs;
}

bool step_reads_src(StepType t) {
    return t == StepType::s || t == StepType::rrs || t == StepType::rrc || t == StepType::rrcs || t == StepType::cpy ||
           t == StepType::re;
}

bool step_writes_dst(StepType t) {
    return t == StepType::r || t == StepType::rcs || t == StepType::rrc || t == StepType::rrcs || t == StepType::cpy ||
           t == StepType::re;
}

int step_copies(StepType type) {
    switch (type) {
        case StepType::rcs:
        case StepType::rrcs: return 2;
        case StepType::nop: return 0;
        default: return 1;
    }
}

namespace {

// A part of the program by position: gpu g, its tb t, that tb's step s (-1: not that deep).
struct Where {
    int64_t gpu = -1;
    int64_t tb = -1;
    int64_t step = -1;
};

class Checker {
public:
    Checker(const Program& program, const ProgramSource& source) : p_(program), src_(source) {}

    void run() {
        check_structure();
        check_step_limits();
        check_nops();
        check_connections();
        check_chunk_sizes();
        check_budget();
        check_operands();
        check_dependencies();
        check_fifos();
        check_deadlock();
    }

    // The program as it runs in place: a buffer declared with 0 chunks that check_chunk_sizes allowed gets the
    // size of its window (msccl_contract.py effective_program).
    Program effective() const {
        Program out = p_;
        if (!in_place_only()) return out;
        const ChunkContract need = contract();
        for (Gpu& gpu : out.gpus) {
            if (gpu.i_chunks == 0 && may_leave_out(gpu, true, need)) gpu.i_chunks = need.input_chunks;
            if (gpu.o_chunks == 0 && may_leave_out(gpu, false, need)) gpu.o_chunks = need.output_chunks;
        }
        return out;
    }

    ChunkContract contract() const {
        const int32_t n = p_.ngpus, c = p_.nchunksperloop;
        if (n < 1 || c < 1)
            fail({}, "nchunksperloop", "cannot derive the collective: ngpus=" + std::to_string(n) +
                                           " and nchunksperloop=" + std::to_string(c) + " must be positive");
        const std::string& kind = p_.coll;
        if (kind == "broadcast" || kind == "reduce" || kind == "allreduce") return {c, c};
        if (kind != "allgather" && kind != "reducescatter" && kind != "alltoall")
            fail({}, "coll", "unknown collective '" + kind + "'");
        if (c % n != 0)
            fail({}, "nchunksperloop", "cannot derive the collective: " + kind + ": nchunksperloop=" +
                                           std::to_string(c) + " is not a multiple of ngpus=" + std::to_string(n));
        const int32_t k = c / n;
        if (kind == "allgather") return {k, c};
        if (kind == "reducescatter") return {c, k};
        return {c, c};  // alltoall: k chunks per (source, destination) pair
    }

private:
    // ------------------------------------------------------------------------------------------ locations

    const XmlElement* element(const Where& w) const {
        if (w.gpu < 0) return src_.algo;
        const auto g = static_cast<size_t>(w.gpu);
        if (w.tb < 0) return g < src_.gpus.size() ? src_.gpus[g] : nullptr;
        const auto t = static_cast<size_t>(w.tb);
        if (w.step < 0) return g < src_.tbs.size() && t < src_.tbs[g].size() ? src_.tbs[g][t] : nullptr;
        const auto s = static_cast<size_t>(w.step);
        if (g < src_.steps.size() && t < src_.steps[g].size() && s < src_.steps[g][t].size())
            return src_.steps[g][t][s];
        return nullptr;
    }

    // "algo/gpu[@id=3]/tb[@id=1]/step[@s=4]" (the ids as the program has them).
    std::string path(const Where& w) const {
        std::string out = "algo";
        if (w.gpu < 0) return out;
        const Gpu& gpu = p_.gpus[static_cast<size_t>(w.gpu)];
        out += "/gpu[@id=" + std::to_string(gpu.id) + "]";
        if (w.tb < 0) return out;
        const Threadblock& tb = gpu.tbs[static_cast<size_t>(w.tb)];
        out += "/tb[@id=" + std::to_string(tb.id) + "]";
        if (w.step < 0) return out;
        return out + "/step[@s=" + std::to_string(tb.steps[static_cast<size_t>(w.step)].s) + "]";
    }

    // The attribute's position (or the element's without one); none for a program built in code.
    Position position(const Where& w, const char* attr) const {
        const XmlElement* e = element(w);
        if (!e) return {};
        const XmlAttribute* a = attr ? e->attribute(attr) : nullptr;
        return a ? a->at : e->at;
    }

    // "<path>@<attr> (line L)".
    std::string location(const Where& w, const char* attr) const {
        std::string out = path(w);
        if (attr) out += std::string("@") + attr;
        const Position at = position(w, attr);
        if (at.line > 0) out += " " + describe_position(at, /*with_column=*/false);
        return out;
    }

    // "<file>: <path>@<attr> (line L): <what>", positioned at the attribute (or the element without one).
    [[noreturn]] void fail(const Where& w, const char* attr, const std::string& what) const {
        throw LoadError(MLOPT_ERR_SEMANTIC, src_.file + ": " + location(w, attr) + ": " + what, position(w, attr));
    }

    // "gpu 0 tb 1 step 4 (s)", as symbolic.py names a step inside a message about another one.
    std::string step_label(size_t g, size_t t, size_t s) const {
        const Gpu& gpu = p_.gpus[g];
        const Threadblock& tb = gpu.tbs[t];
        return "gpu " + std::to_string(gpu.id) + " tb " + std::to_string(tb.id) + " step " + std::to_string(s) +
               " (" + step_type_name(tb.steps[s].type) + ")";
    }

    template <typename F>
    void for_each_step(F&& f) const {
        for (size_t g = 0; g < p_.gpus.size(); ++g)
            for (size_t t = 0; t < p_.gpus[g].tbs.size(); ++t)
                for (size_t s = 0; s < p_.gpus[g].tbs[t].steps.size(); ++s)
                    f(g, t, s, p_.gpus[g].tbs[t].steps[s]);
    }

    // ------------------------------------------------------------------------------------------ checks

    // What the parser already guarantees, re-checked for programs built in code.
    void check_structure() const {
        if (p_.nchannels < 1) fail({}, "nchannels", "nchannels=" + std::to_string(p_.nchannels) + " must be positive");
        if (p_.nchannels > kMaxChannels)
            fail({}, "nchannels", "nchannels=" + std::to_string(p_.nchannels) + " exceeds the executor's " +
                                      std::to_string(kMaxChannels) + " channels");
        if (p_.ngpus != static_cast<int64_t>(p_.gpus.size()))
            fail({}, "ngpus", "ngpus=" + std::to_string(p_.ngpus) + " but the program has " +
                                  std::to_string(p_.gpus.size()) + " gpus");
        for (size_t g = 0; g < p_.gpus.size(); ++g) {
            const Gpu& gpu = p_.gpus[g];
            const Where wg{static_cast<int64_t>(g)};
            if (gpu.id != static_cast<int64_t>(g))
                fail(wg, "id", "gpu at position " + std::to_string(g) + " has id " + std::to_string(gpu.id) +
                                   " (gpu ids must be 0..ngpus-1 in order)");
            check_buffer_sizes(gpu, wg);
            for (size_t t = 0; t < gpu.tbs.size(); ++t) {
                const Threadblock& tb = gpu.tbs[t];
                const Where wt{static_cast<int64_t>(g), static_cast<int64_t>(t)};
                if (tb.id != static_cast<int64_t>(t))
                    fail(wt, "id", "tb at position " + std::to_string(t) + " has id " + std::to_string(tb.id) +
                                       " (tb ids must be 0..n-1 in order)");
                if (tb.chan < 0 || tb.chan >= p_.nchannels)
                    fail(wt, "chan", "channel " + std::to_string(tb.chan) + " is not in 0..nchannels-1 (nchannels=" +
                                         std::to_string(p_.nchannels) + ")");
                for (const auto& [attr, peer] : {std::pair<const char*, int32_t>{"send", tb.send}, {"recv", tb.recv}})
                    if (peer < -1 || peer >= p_.ngpus || peer == gpu.id)
                        fail(wt, attr, std::string(attr) + " peer " + std::to_string(peer) +
                                           " is not -1 or another gpu");
                for (size_t s = 0; s < tb.steps.size(); ++s)
                    if (tb.steps[s].s != static_cast<int64_t>(s))
                        fail({wt.gpu, wt.tb, static_cast<int64_t>(s)}, "s",
                             "s=" + std::to_string(tb.steps[s].s) + ", steps must be numbered by position");
            }
        }
    }

    // Sizes 0..kMaxBufferChunks: the executor keeps offsets in int16_t.
    void check_buffer_sizes(const Gpu& gpu, const Where& wg) const {
        for (const auto& [attr, chunks] : {std::pair<const char*, int32_t>{"i_chunks", gpu.i_chunks},
                                           {"o_chunks", gpu.o_chunks},
                                           {"s_chunks", gpu.s_chunks}}) {
            if (chunks < 0) fail(wg, attr, "buffer sizes must not be negative");
            if (chunks > kMaxBufferChunks)
                fail(wg, attr, std::string(attr) + "=" + std::to_string(chunks) + " exceeds the " +
                                   std::to_string(kMaxBufferChunks) +
                                   " chunks the executor can address (it keeps offsets in 16 bits)");
        }
    }

    void check_step_limits() const {
        for (size_t g = 0; g < p_.gpus.size(); ++g)
            for (size_t t = 0; t < p_.gpus[g].tbs.size(); ++t) {
                const Threadblock& tb = p_.gpus[g].tbs[t];
                if (tb.steps.size() > static_cast<size_t>(kMaxStepsPerThreadblock))
                    fail({static_cast<int64_t>(g), static_cast<int64_t>(t)}, nullptr,
                         std::to_string(tb.steps.size()) + " steps, the executor allows at most " +
                             std::to_string(kMaxStepsPerThreadblock) + " per threadblock");
            }
        for_each_step([&](size_t g, size_t t, size_t s, const Step& st) {
            const Where w{static_cast<int64_t>(g), static_cast<int64_t>(t), static_cast<int64_t>(s)};
            const Threadblock& tb = p_.gpus[g].tbs[t];
            if (st.cnt < 0) fail(w, "cnt", "cnt=" + std::to_string(st.cnt) + " is negative");
            if (st.cnt >= kMaxStepCount)
                fail(w, "cnt", "cnt=" + std::to_string(st.cnt) + ", the executor needs cnt below " +
                                   std::to_string(kMaxStepCount));
            if (step_sends(st.type) && tb.send < 0)
                fail(w, "type", std::string("a ") + step_type_name(st.type) +
                                    " step sends but the threadblock has send=-1");
            if (step_receives(st.type) && tb.recv < 0)
                fail(w, "type", std::string("a ") + step_type_name(st.type) +
                                    " step receives but the threadblock has recv=-1");
        });
    }

    // The executor does not store nops (msccl_parser.cc): a nop only carries a dependency over to the next
    // step, which must then wait itself; anything else silently changes what runs.
    void check_nops() const {
        for (size_t g = 0; g < p_.gpus.size(); ++g)
            for (size_t t = 0; t < p_.gpus[g].tbs.size(); ++t) {
                const Threadblock& tb = p_.gpus[g].tbs[t];
                bool pending_nop_deps = false;
                for (size_t s = 0; s < tb.steps.size(); ++s) {
                    const Step& st = tb.steps[s];
                    const Where w{static_cast<int64_t>(g), static_cast<int64_t>(t), static_cast<int64_t>(s)};
                    if (st.type == StepType::nop) {
                        if (st.depid < 0)
                            fail(w, "depid", "nop without a dependency; the executor drops it and numbers the later "
                                             "steps one lower");
                        if (st.hasdep)
                            fail(w, "hasdep", "nop with hasdep=1; the executor does not store nops, so it never signals");
                        pending_nop_deps = true;  // (depid >= 0 here)
                    } else if (pending_nop_deps) {
                        if (st.depid < 0)
                            fail(w, "depid", "follows nop dependencies but has no dependency itself; the executor "
                                             "rejects this");
                        pending_nop_deps = false;
                    }
                }
                if (pending_nop_deps)
                    fail({static_cast<int64_t>(g), static_cast<int64_t>(t),
                          static_cast<int64_t>(tb.steps.size()) - 1},
                         "type", "the threadblock ends with nop dependencies that the executor drops (no step after them)");
            }
    }

    // One NCCL connection per (peer, channel) and direction: one threadblock at each end of it, and at most
    // kMaxTbsPerChannel threadblocks per channel and direction on one gpu.
    void check_connections() const {
        for (size_t g = 0; g < p_.gpus.size(); ++g) {
            const Gpu& gpu = p_.gpus[g];
            for (const bool sending : {true, false}) {
                const char* attr = sending ? "send" : "recv";
                const char* kind = sending ? "send to" : "receive from";
                std::map<std::pair<int32_t, int32_t>, size_t> first_tb;  // (peer, chan) -> tb position
                std::map<int32_t, int32_t> per_channel;
                for (size_t t = 0; t < gpu.tbs.size(); ++t) {
                    const Threadblock& tb = gpu.tbs[t];
                    const int32_t peer = sending ? tb.send : tb.recv;
                    if (peer < 0) continue;
                    const auto [it, inserted] = first_tb.emplace(std::make_pair(peer, tb.chan), t);
                    if (!inserted)
                        fail({static_cast<int64_t>(g), static_cast<int64_t>(t)}, attr,
                             "tbs " + std::to_string(gpu.tbs[it->second].id) + " and " + std::to_string(tb.id) +
                                 " both " + kind + " gpu " + std::to_string(peer) + " on channel " +
                                 std::to_string(tb.chan) +
                                 "; one connection per (peer, channel) allows one threadblock");
                    if (++per_channel[tb.chan] > kMaxTbsPerChannel)
                        fail({static_cast<int64_t>(g), static_cast<int64_t>(t)}, attr,
                             "more than " + std::to_string(kMaxTbsPerChannel) + " threadblocks " + kind +
                                 " peers on channel " + std::to_string(tb.chan));
                }
            }
        }
    }

    bool in_place_only() const { return p_.inplace && !p_.outofplace; }

    // A buffer declared with 0 chunks that in place is a window of the other one, which must be whole:
    // allgather's input, reducescatter's output, either one for the collectives that share one buffer.
    bool may_leave_out(const Gpu& gpu, bool input, const ChunkContract& need) const {
        if (p_.coll == "allgather") return input;
        if (p_.coll == "reducescatter") return !input;
        return input ? gpu.o_chunks == need.output_chunks : gpu.i_chunks == need.input_chunks;
    }

    // One i_chunks/o_chunks for the whole program (the runtime takes one count), equal to the collective's,
    // except the buffer an in-place-only program may leave out (may_leave_out).
    void check_chunk_sizes() const {
        const ChunkContract need = contract();
        if (p_.gpus.empty()) return;
        const Gpu& first = p_.gpus.front();
        for (size_t g = 1; g < p_.gpus.size(); ++g) {
            const Gpu& gpu = p_.gpus[g];
            for (const auto& [attr, mine, theirs] :
                 {std::tuple<const char*, int32_t, int32_t>{"i_chunks", gpu.i_chunks, first.i_chunks},
                  {"o_chunks", gpu.o_chunks, first.o_chunks}})
                if (mine != theirs)
                    fail({static_cast<int64_t>(g)}, attr,
                         std::string(attr) + "=" + std::to_string(mine) + " but gpu " + std::to_string(first.id) +
                             " has " + attr + "=" + std::to_string(theirs) +
                             "; every gpu needs the same buffer sizes (the runtime takes one count)");
        }
        for (size_t g = 0; g < p_.gpus.size(); ++g) check_gpu_chunk_sizes(g, need);
    }

    void check_gpu_chunk_sizes(size_t g, const ChunkContract& need) const {
        const Gpu& gpu = p_.gpus[g];
        for (const bool input : {true, false}) {
            const char* attr = input ? "i_chunks" : "o_chunks";
            const int32_t declared = input ? gpu.i_chunks : gpu.o_chunks;
            const int32_t needed = input ? need.input_chunks : need.output_chunks;
            if (declared == needed) continue;
            if (declared == 0 && may_leave_out(gpu, input, need)) {
                if (!in_place_only())
                    fail({static_cast<int64_t>(g)}, attr,
                         std::string(attr) + "=0 but the " + p_.coll + " needs " + std::to_string(needed) +
                             ": only an in-place-only program (inplace=1 outofplace=0) may leave out the " +
                             (input ? "input" : "output") + ", which in place is a window of the other buffer");
                continue;
            }
            fail({static_cast<int64_t>(g)}, attr,
                 "i_chunks=" + std::to_string(gpu.i_chunks) + " o_chunks=" + std::to_string(gpu.o_chunks) + ", the " +
                     p_.coll + " needs " + std::to_string(need.input_chunks) + " and " +
                     std::to_string(need.output_chunks) + " (nchunksperloop=" + std::to_string(p_.nchunksperloop) +
                     ", ngpus=" + std::to_string(p_.ngpus) + ")");
        }
    }

    // mlopt's symbolic proof keeps one value per chunk, of up to ngpus contributions: its size is bounded, and
    // the runtime refuses the same programs (status "unsupported") so that both languages agree.
    void check_budget() const {
        const Program eff = effective();
        int64_t chunks = 0;
        for (const Gpu& gpu : eff.gpus) chunks += int64_t{gpu.i_chunks} + gpu.o_chunks + gpu.s_chunks;
        const int64_t work = int64_t{p_.ngpus} * chunks;
        if (work > kProofBudget)
            throw LoadError(MLOPT_ERR_UNSUPPORTED,
                            src_.file + ": " + location({}, nullptr) +
                                ": mlopt does not support programs this large: ngpus x the chunks of every rank's "
                                "buffers = " + std::to_string(work) + " exceeds " + std::to_string(kProofBudget) +
                                " (mlopt's symbolic proof keeps up to ngpus contributions per chunk)",
                            position({}, nullptr));
    }

    static int32_t buffer_chunks(const Gpu& gpu, Buffer b) {
        switch (b) {
            case Buffer::input: return gpu.i_chunks;
            case Buffer::output: return gpu.o_chunks;
            case Buffer::scratch: return gpu.s_chunks;
        }
        return 0;
    }

    // Only the operands a step type uses are checked (r/rcs ignore src, s/rrs ignore dst), as the executor's
    // checkSrc/checkDst do.
    void check_operands() const {
        for_each_step([&](size_t g, size_t t, size_t s, const Step& st) {
            const Where w{static_cast<int64_t>(g), static_cast<int64_t>(t), static_cast<int64_t>(s)};
            const Gpu& gpu = p_.gpus[g];
            const auto check = [&](bool used, const char* side, Buffer buf, int32_t off) {
                const int64_t size = buffer_chunks(gpu, buf);
                if (used && (off < 0 || int64_t{off} + std::max(st.cnt, 0) > size))
                    fail(w, side[0] == 's' ? "srcoff" : "dstoff",
                         std::string(side) + "off=" + std::to_string(off) + " cnt=" + std::to_string(st.cnt) +
                             " is out of range for buffer " + buffer_name(buf) + " (" + std::to_string(size) +
                             " chunks)");
            };
            check(step_reads_src(st.type), "src", st.srcbuf, st.srcoff);
            check(step_writes_dst(st.type), "dst", st.dstbuf, st.dstoff);
        });
    }

    // A step waiting for (tb X, step Z) of its gpu: X and Z must exist, not be later in its own threadblock,
    // and Z must signal (hasdep=1, not a nop): the executor only signals hasdep steps.
    void check_dependencies() const {
        for_each_step([&](size_t g, size_t t, size_t s, const Step& st) {
            if (st.depid < 0) return;  // deps without depid is ignored (symbolic.py notes it)
            const Where w{static_cast<int64_t>(g), static_cast<int64_t>(t), static_cast<int64_t>(s)};
            const Gpu& gpu = p_.gpus[g];
            if (static_cast<size_t>(st.depid) >= gpu.tbs.size())
                fail(w, "depid", "depends on tb " + std::to_string(st.depid) + ", which does not exist on gpu " +
                                     std::to_string(gpu.id));
            const Threadblock& target = gpu.tbs[static_cast<size_t>(st.depid)];
            if (st.deps < 0 || static_cast<size_t>(st.deps) >= target.steps.size())
                fail(w, "deps", "depends on step " + std::to_string(st.deps) + " of tb " + std::to_string(st.depid) +
                                    ", which has " + std::to_string(target.steps.size()) + " steps");
            if (static_cast<size_t>(st.depid) == t && static_cast<size_t>(st.deps) >= s)
                fail(w, "deps", "depends on step " + std::to_string(st.deps) +
                                    " of its own threadblock, which runs later (never completes)");
            const Step& awaited = target.steps[static_cast<size_t>(st.deps)];
            const std::string awaited_label = step_label(g, static_cast<size_t>(st.depid), static_cast<size_t>(st.deps));
            if (awaited.type == StepType::nop)
                fail(w, "deps", "depends on " + awaited_label + ", a nop, which never signals");
            if (!awaited.hasdep)
                fail(w, "deps", "depends on " + awaited_label +
                                    ", which is not marked hasdep=1 (the executor only signals hasdep steps)");
        });
    }

    // Messages match in FIFO order per (sender, receiver, channel), one per sending step with cnt > 0; the n-th
    // receiving step (cnt > 0) of that connection takes the n-th message and must have the same cnt.
    // check_connections made each end of a connection one threadblock, so step order is message order.
    void check_fifos() const {
        struct Message {
            size_t gpu, tb, step;
            int32_t cnt;
        };
        using Connection = std::tuple<int32_t, int32_t, int32_t>;  // sender, receiver, channel
        std::map<Connection, std::vector<Message>> sent, received;
        for_each_step([&](size_t g, size_t t, size_t s, const Step& st) {
            if (st.cnt <= 0) return;  // moves nothing: neither pushes nor pops a message
            const Threadblock& tb = p_.gpus[g].tbs[t];
            const int32_t me = p_.gpus[g].id;
            if (step_sends(st.type)) sent[{me, tb.send, tb.chan}].push_back({g, t, s, st.cnt});
            if (step_receives(st.type)) received[{tb.recv, me, tb.chan}].push_back({g, t, s, st.cnt});
        });
        static const std::vector<Message> none;
        const auto describe = [](const Connection& c) {
            return "gpu " + std::to_string(std::get<0>(c)) + " -> gpu " + std::to_string(std::get<1>(c)) +
                   " on channel " + std::to_string(std::get<2>(c));
        };
        // Every connection with traffic on either side, in a deterministic order.
        std::map<Connection, bool> connections;
        for (const auto& [c, _] : sent) connections[c] = true;
        for (const auto& [c, _] : received) connections[c] = true;
        for (const auto& [c, _] : connections) {
            const auto s_it = sent.find(c);
            const auto r_it = received.find(c);
            const std::vector<Message>& sends = s_it == sent.end() ? none : s_it->second;
            const std::vector<Message>& recvs = r_it == received.end() ? none : r_it->second;
            const size_t matched = std::min(sends.size(), recvs.size());
            for (size_t i = 0; i < matched; ++i) {
                const Message& out = sends[i];
                const Message& in = recvs[i];
                if (out.cnt != in.cnt)
                    fail({static_cast<int64_t>(in.gpu), static_cast<int64_t>(in.tb), static_cast<int64_t>(in.step)},
                         "cnt", "receives cnt=" + std::to_string(in.cnt) + " but the matching send " +
                                    step_label(out.gpu, out.tb, out.step) + " has cnt=" + std::to_string(out.cnt) +
                                    " (message " + std::to_string(i + 1) + " of " + describe(c) + ")");
            }
            if (sends.size() > matched) {
                const Message& out = sends[matched];
                fail({static_cast<int64_t>(out.gpu), static_cast<int64_t>(out.tb), static_cast<int64_t>(out.step)},
                     "type", "unmatched send: message " + std::to_string(matched + 1) + " of " + describe(c) +
                                 ", but gpu " + std::to_string(std::get<1>(c)) + " receives only " +
                                 std::to_string(recvs.size()) + " message(s) on that connection");
            }
            if (recvs.size() > matched) {
                const Message& in = recvs[matched];
                fail({static_cast<int64_t>(in.gpu), static_cast<int64_t>(in.tb), static_cast<int64_t>(in.step)},
                     "type", "unmatched receive: expects message " + std::to_string(matched + 1) + " of " +
                                 describe(c) + ", but gpu " + std::to_string(std::get<0>(c)) + " sends only " +
                                 std::to_string(sends.size()) + " message(s) on that connection");
            }
        }
    }

    // The threadblocks run step by step with unbounded FIFOs (msccl_contract.py _Flow): a step waits for its
    // dependency, then for a message when it receives (cnt > 0), then sends (cnt > 0) and signals when hasdep.
    // Waiters are woken by the event they wait for, so the work is linear in the steps. With one threadblock
    // at each end of a connection (check_connections) and a step's chunk c depending only on chunk c of its
    // message, whole steps give the same verdict as symbolic.py's chunk-by-chunk run.
    class Flow {
    public:
        explicit Flow(const Program& p) : p_(p) {
            for (size_t g = 0; g < p.gpus.size(); ++g) {
                first_.push_back(tbs_.size());
                for (size_t t = 0; t < p.gpus[g].tbs.size(); ++t) tbs_.push_back({g, t});
            }
            pc_.assign(tbs_.size(), 0);
            flag_.assign(tbs_.size(), -1);
            on_flag_.resize(tbs_.size());
            for (size_t i = 0; i < tbs_.size(); ++i) ready_.push_back(i);
        }

        // The threadblocks that never finish, in (gpu, tb) order.
        std::vector<size_t> run() {
            while (!ready_.empty()) {
                const size_t i = ready_.front();
                ready_.pop_front();
                advance(i);
            }
            std::vector<size_t> stuck;
            for (size_t i = 0; i < tbs_.size(); ++i)
                if (pc_[i] < tb(i).steps.size()) stuck.push_back(i);
            return stuck;
        }

        const Threadblock& tb(size_t i) const { return p_.gpus[tbs_[i].first].tbs[tbs_[i].second]; }
        std::pair<size_t, size_t> position(size_t i) const { return tbs_[i]; }
        size_t pc(size_t i) const { return pc_[i]; }
        bool waits_for_flag(size_t i) const {
            const Step& st = tb(i).steps[pc_[i]];
            return st.depid >= 0 && flag_[awaited(i, st)] < st.deps;
        }

    private:
        using Connection = std::tuple<int32_t, int32_t, int32_t>;  // sender, receiver, channel

        size_t awaited(size_t i, const Step& st) const {
            return first_[tbs_[i].first] + static_cast<size_t>(st.depid);
        }

        void wake(std::vector<size_t>& waiters) {
            ready_.insert(ready_.end(), waiters.begin(), waiters.end());
            waiters.clear();
        }

        void advance(size_t i) {
            const Gpu& gpu = p_.gpus[tbs_[i].first];
            const Threadblock& t = tb(i);
            while (pc_[i] < t.steps.size()) {
                const Step& st = t.steps[pc_[i]];
                if (st.depid >= 0 && flag_[awaited(i, st)] < st.deps) {
                    on_flag_[awaited(i, st)].push_back(i);
                    return;
                }
                if (st.cnt > 0 && step_receives(st.type)) {
                    const Connection inbox{t.recv, gpu.id, t.chan};
                    if (available_[inbox] == 0) {
                        on_message_[inbox].push_back(i);
                        return;
                    }
                    --available_[inbox];
                }
                if (st.cnt > 0 && step_sends(st.type)) {
                    const Connection outbox{gpu.id, t.send, t.chan};
                    ++available_[outbox];
                    wake(on_message_[outbox]);
                }
                if (st.hasdep && st.type != StepType::nop) {
                    flag_[i] = static_cast<int64_t>(pc_[i]);
                    wake(on_flag_[i]);
                }
                ++pc_[i];
            }
        }

        const Program& p_;
        std::vector<std::pair<size_t, size_t>> tbs_;  // (gpu, tb) positions
        std::vector<size_t> first_;                   // gpu -> index of its first tb
        std::vector<size_t> pc_;
        std::vector<int64_t> flag_;  // last signalled step, -1: none
        std::vector<std::vector<size_t>> on_flag_;
        std::map<Connection, int64_t> available_;
        std::map<Connection, std::vector<size_t>> on_message_;
        std::deque<size_t> ready_;
    };

    void check_deadlock() const {
        Flow flow(p_);
        const std::vector<size_t> stuck = flow.run();
        if (stuck.empty()) return;
        const size_t i = stuck.front();
        const auto [g, t] = flow.position(i);
        const Where w{static_cast<int64_t>(g), static_cast<int64_t>(t), static_cast<int64_t>(flow.pc(i))};
        const Threadblock& tb = flow.tb(i);
        const Step& st = tb.steps[flow.pc(i)];
        const std::string tail = " (" + std::to_string(stuck.size()) + " threadblock(s) never finish)";
        if (flow.waits_for_flag(i))
            fail(w, "deps", "deadlock: waits for gpu " + std::to_string(p_.gpus[g].id) + " tb " +
                                std::to_string(st.depid) + " to signal step " + std::to_string(st.deps) +
                                ", which never happens" + tail);
        fail(w, "type", "deadlock: waits for a message from gpu " + std::to_string(tb.recv) + " on channel " +
                            std::to_string(tb.chan) + " that never arrives" + tail);
    }

    const Program& p_;
    const ProgramSource& src_;
};

}  // namespace

ChunkContract chunk_contract(const Program& program, const ProgramSource& source) {
    return Checker(program, source).contract();
}

void validate_program(const Program& program, const ProgramSource& source) { Checker(program, source).run(); }

Program effective_program(const Program& program, const ProgramSource& source) {
    return Checker(program, source).effective();
}

}  // namespace mlopt
