build-fuzz/host/nn.o: host/nn.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h host/iter.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:

host/iter.h:
