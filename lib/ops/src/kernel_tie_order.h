// The reference NMS kernel's choice among equal scores (multi_proposal_target.cu as the published
// SNIPER ran it), as a structure that hands out the preferred member in O(1) instead of scanning.
//
// The kernel fills slot j with the best remaining score; among equal scores at array positions p >= j
// it takes the smallest (r mod 32, r mod 1024, r) for r = p - j (1024 threads each keep the first
// maximum of the positions r = t mod 1024; the block reduction prefers the smallest t mod 32, then t),
// and swaps the chosen element into position j.
//
// Members are bucketed by p mod 1024. For slot j the preferred residue class is the first nonempty one
// of (j + c) mod 32, c = 0, 1, ...; within it the first nonempty bucket of (j + c + 32 m) mod 1024,
// m = 0, 1, ...; within the bucket the smallest position. Two levels of 32-bit masks find both.
#ifndef SNIPER_OPS_KERNEL_TIE_ORDER_H_
#define SNIPER_OPS_KERNEL_TIE_ORDER_H_

#include <array>
#include <cstdint>
#include <vector>

namespace sniper {

template <class Item>
class KernelTieOrder {
 public:
  bool empty() const { return classes_ == 0; }

  void Clear() {
    for (int bucket : touched_) buckets_[bucket].clear();
    touched_.clear();
    classes_ = 0;
    class_buckets_.fill(0);
  }

  void Insert(const Item& item, int32_t position) {
    const int bucket = position & 1023;
    if (buckets_[bucket].empty()) {
      touched_.push_back(bucket);
      MarkBucket(bucket);
    }
    buckets_[bucket].push_back({item, position});
  }

  // Removes and returns the member the kernel prefers for `slot` (every member is at a position >= slot).
  Item TakePreferred(int32_t slot) {
    const int residue_start = slot & 31;
    const int c = FirstSet(RotateRight(classes_, residue_start));
    const int residue = (residue_start + c) & 31;
    const int start = (slot + c) & 1023;
    const int m = FirstSet(RotateRight(class_buckets_[residue], start >> 5));
    const int bucket = ((((start >> 5) + m) & 31) << 5) | residue;
    std::vector<Member>& members = buckets_[bucket];
    size_t best = 0;
    for (size_t i = 1; i < members.size(); ++i) {
      if (members[i].position < members[best].position) best = i;
    }
    const Item item = members[best].item;
    members[best] = members.back();
    members.pop_back();
    if (members.empty()) UnmarkBucket(bucket);
    return item;
  }

  // The member at position `from`, if any, now sits at position `to` (the kernel's swap).
  void Move(int32_t from, int32_t to) {
    std::vector<Member>& members = buckets_[from & 1023];
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].position != from) continue;
      const Item item = members[i].item;
      members[i] = members.back();
      members.pop_back();
      if (members.empty()) UnmarkBucket(from & 1023);
      Insert(item, to);
      return;
    }
  }

 private:
  struct Member {
    Item item;
    int32_t position;
  };

  static uint32_t RotateRight(uint32_t bits, int shift) {
    return shift == 0 ? bits : (bits >> shift) | (bits << (32 - shift));
  }
  static int FirstSet(uint32_t bits) { return __builtin_ctz(bits); }

  void MarkBucket(int bucket) {
    classes_ |= 1u << (bucket & 31);
    class_buckets_[bucket & 31] |= 1u << (bucket >> 5);
  }
  void UnmarkBucket(int bucket) {
    uint32_t& row = class_buckets_[bucket & 31];
    row &= ~(1u << (bucket >> 5));
    if (row == 0) classes_ &= ~(1u << (bucket & 31));
  }

  std::array<std::vector<Member>, 1024> buckets_;
  std::vector<int> touched_;  // buckets used since the last Clear
  uint32_t classes_ = 0;      // bit rho: some bucket of positions = rho (mod 32) is nonempty
  std::array<uint32_t, 32> class_buckets_{};  // [rho] bit q: bucket 32 q + rho is nonempty
};

}  // namespace sniper

#endif  // SNIPER_OPS_KERNEL_TIE_ORDER_H_
