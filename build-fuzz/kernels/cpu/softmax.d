build-fuzz/kernels/cpu/softmax.o: kernels/cpu/softmax.c kernels/cpu/cpu.h \
  kernels/cpu/../../host/tensor-impl.h kernels/cpu/../../host/lutra.h

kernels/cpu/cpu.h:

kernels/cpu/../../host/tensor-impl.h:

kernels/cpu/../../host/lutra.h:
