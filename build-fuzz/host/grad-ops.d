build-fuzz/host/grad-ops.o: host/grad-ops.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h host/grad-ops.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:

host/grad-ops.h:
