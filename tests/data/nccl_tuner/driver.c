/* A test driver that reads an NCCL tuner config the way NCCL's example tuner plugin does and answers what
 * the plugin would hand NCCL for a collective call. Written for mlopt's tests (no NVIDIA code is copied);
 * the rules come from NVIDIA/nccl plugins/tuner/example/plugin.c (tuner API v5, ncclTunerPlugin_v5, commit
 * 56a0c2299d0fda19b12e8a6b8a39b48d6054d22c, NCCL 2.29 era; ext-tuner/example/plugin.c of NCCL 2.27-2.28 has
 * the same rules):
 *   - file: $NCCL_TUNER_CONFIG_FILE, else "nccl_tuner.conf", opened with fopen (relative to the cwd); a
 *     missing file loads nothing;
 *   - fgets into a 256-byte buffer; a fragment whose first character is '#' or '\n' is skipped; the first
 *     '\n' ends it; strtok on "," (empty fields vanish), each token trimmed of ' ' and '\t', at most 10 kept;
 *     8 to 10 tokens make a config, other counts are dropped silently;
 *   - collective/algorithm/protocol by exact name, unknown ones read as allreduce/ring/simple; min/max
 *     bytes by strtoull(.., 10); channels, nNodes, nRanks, numPipeOps, regBuff by atoi; absent optional
 *     fields are -1;
 *   - a call starts at 1 channel and takes the first config (file order) with the same collective,
 *     min <= nBytes <= max, and nNodes/nRanks (the communicator's, given at init)/numPipeOps/regBuff equal
 *     or -1, whose algorithm/protocol is in bounds and not NCCL_ALGO_PROTO_IGNORE in the cost table (this
 *     driver's table has every pair available); channels -1 leaves the count at 1.
 *
 * usage (the config file as the plugin finds it):
 *   driver load          one line per fgets fragment: "skip", "drop" or "load C,MIN,MAX,ALGO,PROTO,CH,NN,NR,PO,RB"
 *   driver query         stdin lines "COLLECTIVE NBYTES NNODES NRANKS [NUMPIPEOPS REGBUFF]" ->
 *                        "CHANNELS LINE ALGO PROTO" (LINE: index of the matching config, -1 if none)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_BUFFER 256
#define MIN_FIELDS 8
#define MAX_FIELDS 10
#define MAX_CONFIGS 4096

static const char* const COLLECTIVE_NAMES[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* const ALGORITHM_NAMES[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls",
                                              "nvls_tree", "pat"};
static const char* const PROTOCOL_NAMES[] = {"ll", "ll128", "simple"};
enum { N_COLLECTIVES = 5, N_ALGORITHMS = 7, N_PROTOCOLS = 3 };
enum { DEFAULT_COLLECTIVE = 4, DEFAULT_ALGORITHM = 1, DEFAULT_PROTOCOL = 2 }; /* allreduce, ring, simple */

typedef struct {
  int collective, algorithm, protocol;
  unsigned long long min_bytes, max_bytes;
  int channels, n_nodes, n_ranks, pipe_ops, reg_buff;
} Config;

static int name_index(const char* name, const char* const* names, int count, int fallback) {
  for (int i = 0; i < count; i++)
    if (strcmp(name, names[i]) == 0) return i;
  return fallback;
}

static char* trimmed(char* token) {
  while (*token == ' ' || *token == '\t') token++;
  char* last = token + strlen(token) - 1;
  while (last > token && (*last == ' ' || *last == '\t')) *last-- = '\0';
  return token;
}

/* 1 and *out filled when the fragment is a config, 0 when it is dropped. */
static int parse_fragment(char* fragment, Config* out) {
  char* fields[MAX_FIELDS];
  int count = 0;
  for (char* token = strtok(fragment, ","); token != NULL && count < MAX_FIELDS; token = strtok(NULL, ","))
    fields[count++] = trimmed(token);
  if (count < MIN_FIELDS || count > MAX_FIELDS) return 0;
  out->collective = name_index(fields[0], COLLECTIVE_NAMES, N_COLLECTIVES, DEFAULT_COLLECTIVE);
  out->min_bytes = strtoull(fields[1], NULL, 10);
  out->max_bytes = strtoull(fields[2], NULL, 10);
  out->algorithm = name_index(fields[3], ALGORITHM_NAMES, N_ALGORITHMS, DEFAULT_ALGORITHM);
  out->protocol = name_index(fields[4], PROTOCOL_NAMES, N_PROTOCOLS, DEFAULT_PROTOCOL);
  out->channels = atoi(fields[5]);
  out->n_nodes = atoi(fields[6]);
  out->n_ranks = atoi(fields[7]);
  out->pipe_ops = count > 8 ? atoi(fields[8]) : -1;
  out->reg_buff = count > 9 ? atoi(fields[9]) : -1;
  return 1;
}

static const char* config_path(void) {
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  return path != NULL ? path : "nccl_tuner.conf";
}

/* Reads every config; with report, prints one verdict per fgets fragment. Returns the config count. */
static int load(Config* configs, int report) {
  FILE* file = fopen(config_path(), "r");
  if (file == NULL) return 0;
  char fragment[LINE_BUFFER];
  int count = 0;
  while (fgets(fragment, sizeof(fragment), file) != NULL && count < MAX_CONFIGS) {
    if (fragment[0] == '#' || fragment[0] == '\n') {
      if (report) puts("skip");
      continue;
    }
    fragment[strcspn(fragment, "\n")] = '\0';
    Config* c = &configs[count];
    if (!parse_fragment(fragment, c)) {
      if (report) puts("drop");
      continue;
    }
    count++;
    if (report)
      printf("load %s,%llu,%llu,%s,%s,%d,%d,%d,%d,%d\n", COLLECTIVE_NAMES[c->collective], c->min_bytes,
             c->max_bytes, ALGORITHM_NAMES[c->algorithm], PROTOCOL_NAMES[c->protocol], c->channels,
             c->n_nodes, c->n_ranks, c->pipe_ops, c->reg_buff);
  }
  fclose(file);
  return count;
}

static int matches(const Config* c, int collective, unsigned long long bytes, int n_nodes, int n_ranks,
                   int pipe_ops, int reg_buff) {
  return c->collective == collective && bytes >= c->min_bytes && bytes <= c->max_bytes &&
         (c->n_nodes == -1 || c->n_nodes == n_nodes) && (c->n_ranks == -1 || c->n_ranks == n_ranks) &&
         (c->pipe_ops == -1 || c->pipe_ops == pipe_ops) && (c->reg_buff == -1 || c->reg_buff == reg_buff);
}

static int query(const Config* configs, int count) {
  char line[LINE_BUFFER], name[64];
  unsigned long long bytes;
  int n_nodes, n_ranks, pipe_ops, reg_buff;
  while (fgets(line, sizeof(line), stdin) != NULL) {
    pipe_ops = 1;
    reg_buff = 0;
    int read = sscanf(line, "%63s %llu %d %d %d %d", name, &bytes, &n_nodes, &n_ranks, &pipe_ops, &reg_buff);
    if (read != 4 && read != 6) {
      fprintf(stderr, "bad query: %s", line);
      return 2;
    }
    int collective = name_index(name, COLLECTIVE_NAMES, N_COLLECTIVES, -1);
    if (collective < 0) {
      fprintf(stderr, "unknown collective: %s\n", name);
      return 2;
    }
    int channels = 1, chosen = -1;
    for (int i = 0; i < count && chosen < 0; i++) {
      if (!matches(&configs[i], collective, bytes, n_nodes, n_ranks, pipe_ops, reg_buff)) continue;
      chosen = i; /* every (algorithm, protocol) is in bounds and available in this driver's cost table */
      if (configs[i].channels != -1) channels = configs[i].channels;
    }
    printf("%d %d %s %s\n", channels, chosen, chosen < 0 ? "-" : ALGORITHM_NAMES[configs[chosen].algorithm],
           chosen < 0 ? "-" : PROTOCOL_NAMES[configs[chosen].protocol]);
  }
  return 0;
}

int main(int argc, char** argv) {
  static Config configs[MAX_CONFIGS];
  if (argc != 2 || (strcmp(argv[1], "load") != 0 && strcmp(argv[1], "query") != 0)) {
    fprintf(stderr, "usage: %s load|query\n", argv[0]);
    return 2;
  }
  int report = strcmp(argv[1], "load") == 0;
  int count = load(configs, report);
  return report ? 0 : query(configs, count);
}
