/* Prints the sizes, offsets and values NCCL's ABI fixes, one "name value"
 * per line, for the layout test to compare. */
#include <stddef.h>

#include "common.h"

#define P(name, v) printf("%s %lld\n", name, (long long)(v))
#define OFF(t, f) P(#t "." #f, offsetof(t, f))

int main(void) {
  P("sizeof.ncclUniqueId", sizeof(ncclUniqueId));
  P("sizeof.ncclConfig_t", sizeof(ncclConfig_t));
  P("sizeof.ncclSimInfo_t", sizeof(ncclSimInfo_t));
  P("sizeof.ncclCollConfig_t", sizeof(ncclCollConfig_t));
  P("sizeof.ncclRedOp_t", sizeof(ncclRedOp_t));
  P("sizeof.ncclDataType_t", sizeof(ncclDataType_t));
  P("sizeof.ncclEncryptionConfig_t", sizeof(ncclEncryptionConfig_t));
  OFF(ncclEncryptionConfig_t, mode);
  OFF(ncclEncryptionConfig_t, psk);
  OFF(ncclConfig_t, blocking);
  OFF(ncclConfig_t, netName);
  OFF(ncclConfig_t, commName);
  OFF(ncclConfig_t, graphStreamOrdering);
  OFF(ncclConfig_t, nvlsHostMode);
  OFF(ncclSimInfo_t, estimatedTime);
  OFF(ncclCollConfig_t, launchCompletionEvent);
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  P("init.size", c.size);
  P("init.magic", c.magic);
  P("init.version", c.version);
  P("init.blocking", c.blocking);
  P("init.nvlsHostMode", c.nvlsHostMode);
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  P("sim.magic", s.magic);
  P("ncclSuccess", ncclSuccess);
  P("ncclInProgress", ncclInProgress);
  P("ncclTimeout", ncclTimeout);
  P("ncclNumResults", ncclNumResults);
  P("ncclAvg", ncclAvg);
  P("ncclNumOps", ncclNumOps);
  P("ncclMaxRedOp", ncclMaxRedOp);
  P("ncclBfloat16", ncclBfloat16);
  P("ncclFloat8e4m3", ncclFloat8e4m3);
  P("ncclFloat8e5m2", ncclFloat8e5m2);
  P("ncclNumTypes", ncclNumTypes);
  P("ncclScalarHostImmediate", ncclScalarHostImmediate);
  P("NCCL_SPLIT_NOCOLOR", NCCL_SPLIT_NOCOLOR);
  P("NCCL_CONFIG_UNDEF_INT", NCCL_CONFIG_UNDEF_INT);
  return 0;
}
