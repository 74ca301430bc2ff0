build-fuzz/kernels/cpu/random.o: kernels/cpu/random.c kernels/cpu/cpu.h \
  kernels/cpu/../../host/tensor-impl.h kernels/cpu/../../host/lutra.h

kernels/cpu/cpu.h:

kernels/cpu/../../host/tensor-impl.h:

kernels/cpu/../../host/lutra.h:
