// Plans the tests share: the XML files under runtime/tests/data (data_path) and a 2-rank allreduce written out
// here (kAllreduce2). Used by test_enforcer.cpp, test_enforcer_comm.cpp and test_transport.cpp.
// Header-only (inline), in namespace mlopt_test.
#pragma once

#include <cstdlib>
#include <string>

namespace mlopt_test {

// runtime/tests/data: found through MLOPT_REPO (ctest sets it) or else relative to the working directory.
inline std::string data_path(const std::string& name) {
    const char* repo = std::getenv("MLOPT_REPO");
    return (repo && *repo ? std::string(repo) + "/runtime/tests/data" : std::string("data")) + "/" + name;
}

// A 2-rank allreduce of one chunk: each rank sends its input and reduces what it receives into its output.
inline const char* const kAllreduce2 = R"(<algo name="ar2" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2"
    coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="1099511627776">
  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>)";

}  // namespace mlopt_test
