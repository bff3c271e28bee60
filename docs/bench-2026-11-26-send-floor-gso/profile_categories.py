"""Sorts the samples of `perf script` (from `perf record -g -p DAEMON`) by where the
time went: the kernel under a send (sendmsg/sendmmsg, the receiving side's softirq
included on a veth), the kernel under a TUN read, other kernel work, the AEAD's seal,
and the rest of user space, with the user-space functions that took most.

Usage: perf script -i perf.data | python3 profile_categories.py
"""
import sys,collections
cnt=collections.Counter(); tot=0; usr=collections.Counter()
block=[]
def flush(b):
    global tot
    if not b: return
    tot+=1
    frames=[l.split()[1] if len(l.split())>1 else '' for l in b[1:]]
    leaf=frames[0] if frames else ''
    dso=b[1].split('(')[-1] if len(b)>1 else ''
    chain=' '.join(frames)
    if 'seal' in leaf and 'chacha' in leaf: c='seal'
    elif '__x64_sys_sendmmsg' in chain or '__x64_sys_sendmsg' in chain or '__sys_sendmmsg' in chain or '__sys_sendmsg' in chain: c='k:send'
    elif 'ksys_read' in chain or 'tun_chr_read' in chain: c='k:tunread'
    elif 'kernel' in dso: c='k:other'
    else:
        c='user'; usr[leaf]+=1
    cnt[c]+=1
for line in sys.stdin:
    if line.strip()=='' :
        flush(block); block=[]
    else: block.append(line.strip())
flush(block)
for k,v in cnt.most_common(): print(f"{k:12s} {100*v/tot:5.1f}%")
print('top user:')
for k,v in usr.most_common(25): print(f"   {100*v/tot:5.2f}% {k}")
