package faults

import (
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy in front of Redis, one per replica, so that one replica can be cut from
// Redis while the others keep it. Our own small proxy rather than Toxiproxy: no extra server
// process to build, start and drive over its API, every mode change is synchronous (when SetMode
// returns, the proxy behaves the new way), and only three faults are needed:
//   - cut: every connection is closed and new ones are refused (accepted and closed at once), as
//     a crashed peer or a firewall's reject looks;
//   - blackhole: connections stay open and new ones are accepted, but nothing is forwarded either
//     way (bytes are read and dropped), as a silent partition looks: the replica learns of it
//     only from its own timeouts. Connections that lost bytes are closed when it ends, since
//     their streams are corrupt;
//   - delay: every chunk waits before it is forwarded (order kept: one goroutine per direction),
//     a slow network or a slow Redis.
type Proxy struct {
	name   string
	target string
	ln     net.Listener

	mu    sync.Mutex
	mode  ProxyMode
	delay time.Duration
	conns map[net.Conn]*proxyConn
	done  bool
}

type ProxyMode string

const (
	Pass      ProxyMode = "pass"
	Cut       ProxyMode = "cut"
	Blackhole ProxyMode = "blackhole"
	Delay     ProxyMode = "delay"
)

// proxyConn is one accepted connection; dirty once a blackhole dropped bytes of it.
type proxyConn struct {
	dirty bool
}

func newProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{name: name, target: target, ln: ln, mode: Pass, conns: map[net.Conn]*proxyConn{}}
	go p.accept()
	return p, nil
}

func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.mode == Cut || p.done {
			// Refused: accepted then closed at once, as a client sees a reset.
			p.mu.Unlock()
			c.Close()
			continue
		}
		pc := &proxyConn{}
		p.conns[c] = pc
		p.mu.Unlock()
		go p.serve(c, pc)
	}
}

// state tells a pipe what to do with a chunk it read on conn c: forward it after wait, or drop it.
func (p *Proxy) state(c net.Conn) (forward bool, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.mode {
	case Blackhole:
		if pc := p.conns[c]; pc != nil {
			pc.dirty = true
		}
		return false, 0
	case Delay:
		return true, p.delay
	}
	return true, 0
}

func (p *Proxy) serve(c net.Conn, pc *proxyConn) {
	// During a blackhole the upstream connection is still made: only the bytes are dropped.
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.mode == Cut || p.done {
		p.mu.Unlock()
		u.Close()
		p.drop(c)
		return
	}
	p.conns[u] = pc
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				forward, wait := p.state(src)
				if wait > 0 {
					time.Sleep(wait)
				}
				if forward {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
			}
			if err != nil {
				break
			}
		}
		// One direction ended: end both, so that neither side hangs half open.
		dst.Close()
		src.Close()
	}
	go pipe(u, c)
	go pipe(c, u)
	wg.Wait()
	p.drop(c)
	p.drop(u)
}

func (p *Proxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// SetMode switches the proxy. Cut closes every connection; leaving a blackhole closes the
// connections that lost bytes in it; delay applies to every chunk read from then on.
func (p *Proxy) SetMode(m ProxyMode, delay time.Duration) {
	p.mu.Lock()
	p.mode, p.delay = m, delay
	var close []net.Conn
	for c, pc := range p.conns {
		if m == Cut || (m != Blackhole && pc.dirty) {
			close = append(close, c)
		}
	}
	p.mu.Unlock()
	for _, c := range close {
		c.Close()
	}
}

// SetCut(true) closes every connection through the proxy and refuses new ones until
// SetCut(false).
func (p *Proxy) SetCut(cut bool) {
	if cut {
		p.SetMode(Cut, 0)
	} else {
		p.SetMode(Pass, 0)
	}
}

func (p *Proxy) Close() {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	p.SetMode(Cut, 0)
	p.ln.Close()
}
