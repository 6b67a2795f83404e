// Redis Cluster key slots: CRC16-XMODEM of the key (or of its {hash tag})
// modulo 16384, bit for bit what Redis computes (cluster.c keyHashSlot).
//
// Thread safety: pure functions.
#ifndef KVTIER_STORAGE_REMOTE_REDIS_KEY_SLOT_H_
#define KVTIER_STORAGE_REMOTE_REDIS_KEY_SLOT_H_

#include <cstdint>
#include <string_view>

namespace kvtier::remote {

// Number of hash slots in a Redis Cluster; slots are 0 .. kClusterSlots - 1.
inline constexpr int kClusterSlots = 16384;

// CRC16-XMODEM (polynomial 0x1021, init 0, no reflection, no final xor):
// Crc16Xmodem("123456789") == 0x31C3.
uint16_t Crc16Xmodem(std::string_view bytes);

// The slot of `key`. When the key holds a '{' followed later by a '}' with
// at least one byte between them, only the bytes between the first '{' and
// the first '}' after it are hashed ("{user1000}.following" hashes
// "user1000"); otherwise ("{}", "foo{", "{}{a}") the whole key is hashed.
uint16_t KeyHashSlot(std::string_view key);

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_KEY_SLOT_H_
