package redisstore

import "github.com/sluicehq/caddy-sluice/algorithms"

// hashSlotCount is the number of Redis Cluster hash slots.
const hashSlotCount = 16384

// hashSlot returns the Cluster hash slot of a key whose hash tag is tag (the
// text between the first '{' and the next '}'): CRC16/XMODEM of the tag,
// modulo 16384, as Redis computes it.
func hashSlot(tag []byte) uint16 {
	var crc uint16
	for _, b := range tag {
		crc ^= uint16(b) << 8
		for i := 0; i < 8; i++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % hashSlotCount
}

// hashSlotOf is the Cluster hash slot of every key of identity k: a key's hash tag
// is k's text form (Store.Key: neither the prefix nor the encoded zone name
// holds a '{').
func hashSlotOf(k algorithms.Key) uint16 {
	var b [2*algorithms.KeySize + 8]byte
	return hashSlot(k.AppendText(b[:0]))
}
