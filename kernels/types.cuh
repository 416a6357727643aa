// Fixed-width integer names shared by the device (NVRTC, no system headers)
// and the CPU emulation (g++). Nothing else belongs here.
#pragma once
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;
