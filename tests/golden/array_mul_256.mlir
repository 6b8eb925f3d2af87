module {
  aie.device(npu2) {
    func.func private @mul_f32_f32(memref<256xf32>, memref<256xf32>, memref<256xf32>, i32) attributes {link_with = "binary.o"}
    %shim_noc_tile_0_0 = aie.tile(0, 0)
    %mem_tile_0_1 = aie.tile(0, 1)
    %tile_0_2 = aie.tile(0, 2)
    aie.objectfifo @in0_0(%shim_noc_tile_0_0, {%mem_tile_0_1}, 2 : i32) : !aie.objectfifo<memref<256xf32>>
    aie.objectfifo @in0_0_0(%mem_tile_0_1, {%tile_0_2}, 2 : i32) : !aie.objectfifo<memref<256xf32>>
    aie.objectfifo @in1_0(%shim_noc_tile_0_0, {%mem_tile_0_1}, 2 : i32) : !aie.objectfifo<memref<256xf32>>
    aie.objectfifo @in1_0_0(%mem_tile_0_1, {%tile_0_2}, 2 : i32) : !aie.objectfifo<memref<256xf32>>
    aie.objectfifo @out0_0_0(%tile_0_2, {%mem_tile_0_1}, 2 : i32) : !aie.objectfifo<memref<256xf32>>
    aie.objectfifo @out0_0(%mem_tile_0_1, {%shim_noc_tile_0_0}, 2 : i32) : !aie.objectfifo<memref<256xf32>>
    aie.objectfifo.link [@in0_0] -> [@in0_0_0]([] [])
    aie.objectfifo.link [@in1_0] -> [@in1_0_0]([] [])
    aie.objectfifo.link [@out0_0_0] -> [@out0_0]([] [])
    %core_0_2 = aie.core(%tile_0_2) {
      %c1 = arith.constant 0 : index
      %c2 = arith.constant 9223372036854775807 : index
      %c3 = arith.constant 1 : index
      scf.for %arg4 = %c1 to %c2 step %c3 {
        %5 = aie.objectfifo.acquire @in0_0_0(Consume, 1) : !aie.objectfifosubview<memref<256xf32>>
        %6 = aie.objectfifo.subview.access %5[0] : !aie.objectfifosubview<memref<256xf32>> -> memref<256xf32>
        %7 = aie.objectfifo.acquire @in1_0_0(Consume, 1) : !aie.objectfifosubview<memref<256xf32>>
        %8 = aie.objectfifo.subview.access %7[0] : !aie.objectfifosubview<memref<256xf32>> -> memref<256xf32>
        %9 = aie.objectfifo.acquire @out0_0_0(Produce, 1) : !aie.objectfifosubview<memref<256xf32>>
        %10 = aie.objectfifo.subview.access %9[0] : !aie.objectfifosubview<memref<256xf32>> -> memref<256xf32>
        %c11 = arith.constant 256 : i32
        func.call @mul_f32_f32(%6, %8, %10, %c11) : (memref<256xf32>, memref<256xf32>, memref<256xf32>, i32) -> ()
        aie.objectfifo.release @in0_0_0(Consume, 1)
        aie.objectfifo.release @in1_0_0(Consume, 1)
        aie.objectfifo.release @out0_0_0(Produce, 1)
      }
      aie.end
    }
    aie.runtime_sequence(%in0: memref<256xf32>, %in1: memref<256xf32>, %out0: memref<256xf32>) {
      %t12 = aiex.dma_configure_task_for @out0_0 {
        aie.dma_bd(%out0 : memref<256xf32>, 0, 256, [<size = 256, stride = 1>]) {bd_id = 0 : i32}
        aie.end
      } {issue_token = true}
      aiex.dma_start_task(%t12)
      %t13 = aiex.dma_configure_task_for @in0_0 {
        aie.dma_bd(%in0 : memref<256xf32>, 0, 256, [<size = 256, stride = 1>]) {bd_id = 1 : i32}
        aie.end
      } {issue_token = true}
      aiex.dma_start_task(%t13)
      %t14 = aiex.dma_configure_task_for @in1_0 {
        aie.dma_bd(%in1 : memref<256xf32>, 0, 256, [<size = 256, stride = 1>]) {bd_id = 2 : i32}
        aie.end
      } {issue_token = true}
      aiex.dma_start_task(%t14)
      aiex.dma_await_task(%t12)
      aiex.dma_await_task(%t13)
      aiex.dma_await_task(%t14)
    }
  }
}
