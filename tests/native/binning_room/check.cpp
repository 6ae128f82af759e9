// Runs BinningRoom (native/core/binning_room.h) over a sequence of instance counts, one
// per call, as the CUDA backend does: a call given room builds its lists in it and, when
// its count outgrows the room, bins again reading its count back first; a call given none
// reads its count back first. tests/native/test_binning_room_rule.py builds and runs it.
//
//   check COUNT...
//
// Output, one line per call: the room given (0: none), the path ("count": the count read
// back first; "room": built in the room; "again": outgrew it and binned again) and the
// padding sorted behind the count (room - count on the room path, else 0).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/binning_room.h"

int main(int argc, char** argv) {
  pulsar::BinningRoom room;
  for (int i = 1; i < argc; ++i) {
    const std::int64_t count = std::strtoll(argv[i], nullptr, 10);
    const std::int64_t given = room.next();
    const char* path = given == 0 ? "count" : count > given ? "again" : "room";
    const std::int64_t padding = given > 0 && count <= given ? given - count : 0;
    room.learn(count);  // once per call, also after binning again
    std::printf("%lld %s %lld\n", static_cast<long long>(given), path, static_cast<long long>(padding));
  }
  return 0;
}
