"""Splits the samples of `perf script` (from `perf record -g -p DAEMON`) that fall under
a UDP send: how many of them are the receiving side's stack (IP input, UDP delivery,
socket wake-ups), which a veth runs inside the sender's system call; and how many are
BPF programs attached by the host (map updates under `udp_send_skb`).

Usage: perf script -i perf.data | python3 send_split.py
"""
import collections,sys
tot=0; send=0; rcv=0; cats=collections.Counter()
block=[]
def flush(b):
    global tot,send,rcv
    if not b: return
    tot+=1
    frames=[l.split()[1] if len(l.split())>1 else '' for l in b[1:]]
    chain=' '.join(frames)
    if 'sys_sendmmsg' in chain or 'sys_sendmsg' in chain:
        send+=1
        if any(x in chain for x in ['ip_rcv','__netif_receive_skb','process_backlog','net_rx_action','ip_local_deliver','udp_rcv']):
            rcv+=1
    if 'htab_map' in chain or 'bpf_' in chain: cats['bpf']+=1
for line in sys.stdin:
    if line.strip()=='':
        flush(block); block=[]
    else: block.append(line.strip())
flush(block)
print(f"samples {tot}: under sends {100*send/tot:.1f}%, of which the receivers' side {100*rcv/tot:.1f}%; bpf {100*cats['bpf']/tot:.1f}%")
