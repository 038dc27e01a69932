package pooler

import "context"

// A session ends when the context its Serve was given is done (a front's
// hard stop). Each session used to register its own context.AfterFunc for
// that: an afterFuncCtx, a closure and an entry in the context's children,
// some 200 bytes that every idle session kept. The sessions of one front
// share their context, so the pooler registers one AfterFunc per context
// (told apart by its Done channel) and, when it runs, kills every session
// registered with it.

// ctxKill is the pooler's AfterFunc on one context. Its fields are guarded
// by Pooler.mu.
type ctxKill struct {
	done <-chan struct{} // the context's Done channel, its key in Pooler.kills
	n    int             // sessions registered with it
	stop func() bool     // stops the AfterFunc
}

// watchCtxLocked arranges for s to be killed once ctx is done. p.mu must
// be held.
func (p *Pooler) watchCtxLocked(s *session, ctx context.Context) {
	done := ctx.Done()
	if done == nil {
		return // never done
	}
	k := p.kills[done]
	if k == nil {
		if p.kills == nil {
			p.kills = map[<-chan struct{}]*ctxKill{}
		}
		k = &ctxKill{done: done}
		p.kills[done] = k
		// The function runs on its own goroutine, at once if ctx is
		// already done; it takes p.mu after this returns.
		k.stop = context.AfterFunc(ctx, func() { p.killCtx(k) })
	}
	k.n++
	s.ctxKill = k
}

// unwatchCtxLocked undoes watchCtxLocked for a session that ended, and
// stops the AfterFunc when it was the last session on its context. p.mu
// must be held.
func (p *Pooler) unwatchCtxLocked(s *session) {
	k := s.ctxKill
	if k == nil {
		return
	}
	s.ctxKill = nil
	k.n--
	if k.n == 0 && p.kills[k.done] == k {
		k.stop()
		delete(p.kills, k.done)
	}
}

// killCtx kills every session registered with k, whose context is done.
// A session that begins on that context afterwards registers a new
// AfterFunc, which runs at once.
func (p *Pooler) killCtx(k *ctxKill) {
	p.mu.Lock()
	if p.kills[k.done] == k {
		delete(p.kills, k.done)
	}
	var victims []*session
	for s := range p.live {
		if s.ctxKill == k {
			victims = append(victims, s)
		}
	}
	p.mu.Unlock()
	for _, s := range victims {
		go s.kill() // as each session's own AfterFunc did: one stuck session delays no other
	}
}
