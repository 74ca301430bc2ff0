build-fuzz/host/ops.o: host/ops.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h host/grad-ops.h host/iter.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:

host/grad-ops.h:

host/iter.h:
