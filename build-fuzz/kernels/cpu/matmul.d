build-fuzz/kernels/cpu/matmul.o: kernels/cpu/matmul.c kernels/cpu/cpu.h \
  kernels/cpu/../../host/tensor-impl.h kernels/cpu/../../host/lutra.h \
  /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
  /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h

kernels/cpu/cpu.h:

kernels/cpu/../../host/tensor-impl.h:

kernels/cpu/../../host/lutra.h:

/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h:

/usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h:
